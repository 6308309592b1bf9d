package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Redial backoff bounds: the first redial after a close is immediate, then the wait
// doubles up to the cap, with jitter.
const (
	RedialMinDefault = 100 * time.Millisecond
	RedialMaxDefault = 10 * time.Second
)

// Conn owns one client's life for a publisher that dialed it itself: it dials when
// there is none, and dials again, with backoff and jitter, whenever the client reports
// that it closed for good (a server's protocol error, revoked credentials, a restart
// that outlasted the client's own reconnect budget). A closed client is never handed
// out: "unavailable" lasts only until the broker answers a dial again.
type Conn[T any] struct {
	dial   func(ctx context.Context) (T, error)
	closed func(T) bool
	close  func(T)

	mu       sync.Mutex
	cur      T
	live     bool
	failures int
	notUntil time.Time // no dial before this (backoff after a failed dial)
}

// NewConn returns an owner that dials with dial, asks closed whether a client closed
// for good, and closes a client with close.
func NewConn[T any](dial func(ctx context.Context) (T, error), closed func(T) bool, close func(T)) *Conn[T] {
	return &Conn[T]{dial: dial, closed: closed, close: close}
}

// Get returns the live client, dialing one if there is none or the last one closed
// for good. While a redial backs off, or when it fails, the error is Unavailable.
func (c *Conn[T]) Get(ctx context.Context) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live && !c.closed(c.cur) {
		return c.cur, nil
	}
	if c.live { // closed for good: let it go, dial anew
		c.close(c.cur)
		c.live = false
	}
	var zero T
	if wait := time.Until(c.notUntil); wait > 0 {
		return zero, Unavailable(fmt.Errorf("the connection closed; dialing again in %v", wait.Round(time.Millisecond)))
	}
	t, err := c.dial(ctx)
	if err != nil {
		c.failures++
		d := min(RedialMinDefault<<min(c.failures-1, 16), RedialMaxDefault)
		c.notUntil = time.Now().Add(d/2 + rand.N(d/2+1))
		if !IsUnavailable(err) {
			err = Unavailable(err)
		}
		return zero, err
	}
	c.cur, c.live, c.failures, c.notUntil = t, true, 0, time.Time{}
	return t, nil
}

// Connect dials now, for a constructor that reports a bad address or an unreachable
// server at once: the error is the dial's own, unclassified.
func (c *Conn[T]) Connect(ctx context.Context) error {
	t, err := c.dial(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live {
		c.close(c.cur)
	}
	c.cur, c.live, c.failures, c.notUntil = t, true, 0, time.Time{}
	return nil
}

// Current returns the client in hand, live or not, and whether there is one: for
// what needs no connection of its own (a limit the last connection learned).
func (c *Conn[T]) Current() (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.live
}

// Close closes the client in hand, if any.
func (c *Conn[T]) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live {
		c.close(c.cur)
		c.live = false
	}
}
