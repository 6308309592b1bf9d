package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// A live load: producers commit at a fixed rate while the relay runs, and each
// event's latency is the broker's receive time (JetStream's timestamp, on this
// machine's clock) minus the producer's COMMIT returning.

type liveOpts struct {
	rate, seconds, conns, perTx int
	published                   int    // rows written and published before the load, not vacuumed since
	mode, write, completion     string // outbox relay (mode "" with wm set: Watermill)
	inProcess                   bool
	wm                          *wmTuning // the Watermill forwarder instead of outbox's relay
}

type liveResult struct {
	lat      []time.Duration // sorted
	achieved float64         // events/s committed
	cpu      float64         // relay process CPU seconds over the run
	rss      int64           // peak RSS, KiB
	backlog  int             // most events committed and not yet at the broker
}

func (r liveResult) q(p float64) time.Duration {
	return r.lat[int(p*float64(len(r.lat)-1))].Round(10 * time.Microsecond)
}

func (r liveResult) cpuPerEvent() float64 { return r.cpu / float64(len(r.lat)) * 1e6 }

// writeFunc commits the events numbered from..to-1 in one transaction and returns
// their ids (the broker's message ids).
type writeFunc func(ctx context.Context, from, to int) ([]string, error)

// runLive runs one live load against outbox's relay or Watermill's forwarder.
func runLive(dbURL, natsURL string, o liveOpts) (liveResult, error) {
	ctx := context.Background()
	prefix := testenv.UniqueName("benchlive")
	js, closeStream, err := openStream(ctx, natsURL, prefix, jetstream.FileStorage)
	if err != nil {
		return liveResult{}, err
	}
	defer closeStream()

	var write writeFunc
	var cmd *exec.Cmd
	if o.wm != nil {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return liveResult{}, err
		}
		cfg.MaxConns = int32(o.conns + 2)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return liveResult{}, err
		}
		defer pool.Close()
		schema, drop, err := wmBacklog(ctx, pool, 0, 1, "")
		if err != nil {
			return liveResult{}, err
		}
		defer drop()
		if cmd, err = startWatermill(dbURL, natsURL, schema, *o.wm); err != nil {
			return liveResult{}, err
		}
		write = wmWriter(pool, schema, prefix+".order")
	} else {
		pool, table, drop, err := scratchFor(ctx, dbURL, int32(o.conns+2), o.mode, o.write)
		if err != nil {
			return liveResult{}, err
		}
		defer drop()
		if o.published > 0 {
			// A table between two vacuums: the published rows' entries are still in
			// the unpublished rows' index.
			q := pgx.Identifier{table.Schema, table.Name}.Sanitize()
			if _, err := pool.Exec(ctx, `INSERT INTO `+q+` (aggregatetype, aggregateid, type, payload)
SELECT 'order', 'old-' || (i % 1000), 'OrderPlaced', '{}' FROM generate_series(1, $1::int) AS i`, o.published); err != nil {
				return liveResult{}, err
			}
			if _, err := pool.Exec(ctx, `UPDATE `+q+` SET published_at = now()`); err != nil {
				return liveResult{}, err
			}
		}
		if o.inProcess {
			stop, err := inProcessRelay(ctx, pool, table, js, o.mode, prefix)
			if err != nil {
				return liveResult{}, err
			}
			defer stop()
		} else {
			bin := filepath.Join(os.TempDir(), "outbox-bench-relay")
			if out, err := exec.Command("go", "build", "-C", "..", "-o", bin, "./cmd/outbox").CombinedOutput(); err != nil {
				return liveResult{}, fmt.Errorf("build relay: %v\n%s", err, out)
			}
			args := []string{"relay", "--http=", "--db", dbURL, "--broker", natsURL, "--table", table.Schema + "." + table.Name,
				"--mode", o.mode, "--topic-template", prefix + ".${aggregatetype}", "--log-level", env("BENCH_RELAY_LOG", "warn")}
			if o.completion != "" && o.mode != "cdc" {
				args = append(args, "--completion", o.completion)
			}
			cmd = exec.Command(bin, args...)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				return liveResult{}, err
			}
		}
		w, _ := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
		write = func(ctx context.Context, from, to int) ([]string, error) {
			evs := make([]outbox.Event, 0, to-from)
			for k := from; k < to; k++ {
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("customer-%04d", k%1000), Type: "OrderPlaced", Payload: payload(k)})
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
				return nil, err
			}
			ids := make([]string, len(evs))
			for i := range evs {
				ids[i] = evs[i].ID // the writer filled them in
			}
			return ids, nil
		}
	}
	if cmd != nil {
		defer stopProcess(cmd)
	}
	time.Sleep(time.Second) // the relay is up and streaming
	cpu0 := 0.0
	if cmd != nil {
		cpu0 = cpuSeconds(cmd.Process.Pid)
	}

	// Read the stream while producing, so the backlog can be sampled.
	var committed sync.Map // id -> time
	var produced, arrived atomic.Int64
	cons, err := js.OrderedConsumer(ctx, prefix, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return liveResult{}, err
	}
	var lat []time.Duration
	var received []jetstream.Msg // matched with their commit times once all arrived
	var mu sync.Mutex
	total := o.rate * o.seconds / o.perTx * o.perTx
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		received = append(received, m)
		mu.Unlock()
		arrived.Add(1)
	})
	if err != nil {
		return liveResult{}, err
	}
	defer cc.Stop()

	var wg sync.WaitGroup
	var werr atomic.Value
	txs := total / o.perTx
	per := time.Duration(float64(time.Second) * float64(o.conns) * float64(o.perTx) / float64(o.rate))
	start := time.Now()
	for c := 0; c < o.conns; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			next := start.Add(time.Duration(c) * per / time.Duration(o.conns))
			for i := c; i < txs; i += o.conns {
				time.Sleep(time.Until(next))
				next = next.Add(per)
				ids, err := write(ctx, i*o.perTx, (i+1)*o.perTx)
				if err != nil {
					werr.Store(err)
					return
				}
				now := time.Now()
				for _, id := range ids {
					committed.Store(id, now)
				}
				produced.Add(int64(len(ids)))
			}
		}(c)
	}
	var r liveResult
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		for produced.Load() < int64(total) && werr.Load() == nil {
			r.backlog = max(r.backlog, int(produced.Load()-arrived.Load()))
			if cmd != nil {
				r.rss = max(r.rss, hwm(cmd.Process.Pid))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	wg.Wait()
	<-sampling
	if err, _ := werr.Load().(error); err != nil {
		return r, err
	}
	r.achieved = float64(total) / time.Since(start).Seconds()
	for deadline := time.Now().Add(60 * time.Second); arrived.Load() < int64(total) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cc.Stop()
	if cmd != nil {
		r.cpu = cpuSeconds(cmd.Process.Pid) - cpu0
		r.rss = max(r.rss, hwm(cmd.Process.Pid))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range received {
		md, err := m.Metadata()
		if err != nil {
			return r, err
		}
		if c, ok := committed.Load(m.Headers().Get("Nats-Msg-Id")); ok {
			lat = append(lat, max(0, md.Timestamp.Sub(c.(time.Time))))
		}
	}
	if len(lat) < total {
		return r, fmt.Errorf("only %d of %d events arrived", len(lat), total)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r.lat = lat
	return r, nil
}

// wmWriter publishes through Watermill's forwarder publisher inside the producer's
// transaction, as its documentation shows.
func wmWriter(pool *pgxpool.Pool, schema, topic string) writeFunc {
	logger := watermill.NopLogger{}
	return func(ctx context.Context, from, to int) ([]string, error) {
		msgs := make([]*message.Message, 0, to-from)
		ids := make([]string, 0, to-from)
		for k := from; k < to; k++ {
			m := message.NewMessage(watermill.NewUUID(), payload(k))
			m.Metadata.Set("partition_key", fmt.Sprintf("customer-%04d", k%1000))
			msgs = append(msgs, m)
			ids = append(ids, m.UUID)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: wmSchema(schema, wmTuning{})}, logger)
			if err != nil {
				return err
			}
			return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic}).Publish(topic, msgs...)
		})
		return ids, err
	}
}
