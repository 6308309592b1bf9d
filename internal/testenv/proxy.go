package testenv

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/broker"
)

// Proxy forwards TCP connections to a server and can blackhole them: stop forwarding
// in both directions without closing anything, the worst half-open case (a cut
// network, a NAT that dropped its state). Heal resumes forwarding on the same
// connections.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	holed bool
	conns []net.Conn
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target; it is closed when
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops forwarding; bytes in flight wait in the kernel's buffers.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.holed = true
	p.mu.Unlock()
}

// Heal resumes forwarding.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.holed = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close closes the listener and every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.holed = false
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, waiting before each write while the proxy is blackholed.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.holed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// ProxiedPool returns a pool whose connections to the database at url go through a
// new Proxy, and that proxy; both end with the test.
func ProxiedPool(t testing.TB, url string) (*pgxpool.Pool, *Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// Counted is a publisher that counts the messages handed to it, to tell which of
// several relays sharing one broker published.
type Counted struct {
	broker.Publisher
	N atomic.Int64
}

// Publish implements broker.Publisher.
func (c *Counted) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	c.N.Add(int64(len(msgs)))
	return c.Publisher.Publish(ctx, msgs)
}
