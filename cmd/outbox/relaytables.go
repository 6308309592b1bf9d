package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/replay"
	"github.com/outboxd/outbox/supervisor"
)

// tablesSupervisor is `outbox relay --tables`: one relay per matching table in this
// process, each exactly as a relay of that table alone (its leadership, its order
// per aggregate, its dead letters, its completion), sharing one publisher, one pool
// (--max-conns), one session for the leadership locks and one for the wake-ups
// (poll mode) or one replication slot, publication and connection (CDC mode).
// Tables created or dropped are found every --tables-rescan. closeAll closes what
// it opened.
func tablesSupervisor(ctx context.Context, o *relayOptions) (_ *supervisor.Config, closeAll func(), err error) {
	var cl closers
	defer func() {
		if err != nil {
			cl.close()
		}
	}()
	pool, sessions, err := openTablesPools(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	cl.add(pool.Close)
	if sessions != pool {
		cl.add(sessions.Close)
	}
	shared := outboxpgx.NewShared(sessions)
	cl.add(shared.Close)
	o.broker.logger = o.logger
	// Shared by the tables' relays, and the dashboard's replays; with exactly-once,
	// each relay has a transactional publisher of its own (open).
	pub, err := startBroker(ctx, o.brokerURL, o.broker.outsideTransactions(), o.logger)
	if err != nil {
		return nil, nil, err
	}
	cl.add(func() { _ = pub.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_db_pool_connections",
		Help: "Database connections the relays' pool holds (in use, idle or opening), at most --max-conns."},
		func() float64 { return float64(pool.Stat().TotalConns()) }))
	set := &tableRelays{o: o, pool: pool, shared: shared, pub: pub, refused: map[string]bool{}}
	sc := &supervisor.Config{Find: set.find, Rescan: o.tablesRescan, Open: set.open, Publisher: pub, Ping: pool.Ping, Registry: reg,
		StartAttrs: []any{"patterns", patternsString(o.tables), "max_conns", pool.Config().MaxConns}}
	if o.mode == "cdc" {
		stream, err := set.sharedStream(sessions)
		if err != nil {
			return nil, nil, err
		}
		sc.Beside = append(sc.Beside, stream)
	} else {
		// CDC relays wake up on the stream; polling ones on this.
		sc.Beside = append(sc.Beside, set.wakePending)
	}
	return sc, cl.close, nil
}

// openTablesPools opens the pool every table's relay claims through, capped at
// --max-conns, and the pool the shared sessions (the leadership locks, LISTEN) come
// from: the same one, or with --leader-db a direct one of two connections, when
// --db goes through a transaction-pooling proxy.
func openTablesPools(ctx context.Context, o *relayOptions) (pool, sessions *pgxpool.Pool, err error) {
	dsn := o.dsn
	if o.maxConns > 0 {
		if strings.Contains(dsn, "pool_max_conns=") {
			return nil, nil, usageErr("--max-conns and the --db URL's pool_max_conns: give one of them")
		}
		dsn = withParam(dsn, "pool_max_conns", fmt.Sprint(o.maxConns))
	}
	if pool, err = openPool(ctx, "--db", dsn, o.leaderDSN != ""); err != nil {
		return nil, nil, err
	}
	pooled, err := transactionPooled(ctx, pool)
	switch {
	case err != nil:
		pool.Close()
		return nil, nil, fmt.Errorf("database %s: %w", redact.URL(o.dsn), err)
	case pooled && o.leaderDSN == "":
		pool.Close()
		return nil, nil, usageErr("--db %s goes through a transaction-pooling proxy (PgBouncer's pool_mode = transaction): the relays' leadership locks and LISTEN need sessions of their own; give --leader-db a direct URL to PostgreSQL, or use session pooling (docs/operations.md)", redact.URL(o.dsn))
	case o.leaderDSN == "":
		return pool, pool, nil
	}
	if sessions, err = openPool(ctx, "--leader-db", withParam(o.leaderDSN, "pool_max_conns", "2"), false); err != nil {
		pool.Close()
		return nil, nil, err
	}
	if pooled, err := transactionPooled(ctx, sessions); err != nil || pooled {
		pool.Close()
		sessions.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("database %s: %w", redact.URL(o.leaderDSN), err)
		}
		return nil, nil, usageErr("--leader-db %s goes through a transaction-pooling proxy too: give it a direct URL to PostgreSQL", redact.URL(o.leaderDSN))
	}
	return pool, sessions, nil
}

// withParam adds name=value to a URL's query, unless the URL sets name already.
func withParam(dsn, name, value string) string {
	if strings.Contains(dsn, name+"=") {
		return dsn
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + name + "=" + value
}

// tableRelays opens the relays of the tables --tables matches, for the supervisor.
type tableRelays struct {
	o      *relayOptions
	pool   *pgxpool.Pool
	shared *outboxpgx.Shared
	pub    broker.Publisher
	sup    *supervisor.Supervisor // the stream's rescans: set before it runs

	cdc     *pgcdc.Shared   // CDC mode: the slot every table is read from (nil: poll mode)
	refused map[string]bool // tables refused as owned by others, with the reason: said once (find's, on the supervisor's goroutine)
}

// find lists the tables --tables matches whose owners are trusted.
func (s *tableRelays) find(ctx context.Context) ([]outboxdriver.Table, error) {
	tables, refused, err := outboxpgx.FindTrustedTables(ctx, s.pool, s.o.trustOwners, s.o.tables...)
	if err != nil {
		return nil, err
	}
	for _, r := range refused {
		key := r.Table.String() + "\x00" + r.Reason
		if !s.refused[key] {
			s.refused[key] = true
			s.o.logger.Error("relay: refusing a table owned by others; it is not relayed", "table", r.Table.String(), "reason", r.Reason)
		}
	}
	return tables, nil
}

// sharedStream makes the stream of every table's events, from one slot and one
// publication (--slot, --publication; default outbox_tables) over one replication
// connection, direct (--leader-db) when --db goes through a proxy. It runs beside
// the relays, from once the tables matching at start joined (none of their events
// is read unrouted); one that needs an operator (a lost slot, wal_level) ends the
// relay with its error.
func (s *tableRelays) sharedStream(direct *pgxpool.Pool) (func(context.Context, *supervisor.Supervisor) error, error) {
	o := s.o
	patterns := o.tables
	var err error
	s.cdc, err = pgcdc.NewShared(s.pool, &pgcdc.SharedConfig{Slot: o.cdc.Slot, Publication: o.cdc.Publication,
		MaxPending: o.cdc.MaxPending, MaxPendingBytes: o.cdc.MaxPendingBytes, RecreateSlot: o.cdc.RecreateSlot, ParkAfter: o.parkAfter, MaxSpilled: o.maxSpilled,
		Logger: o.logger, Timeout: o.cfg.LeaderTimeout, Direct: direct,
		Match:  func(t outboxdriver.Table) bool { return outboxdriver.MatchAny(patterns, t) },
		Rescan: func(ctx context.Context) error { return s.sup.Scan(ctx) }})
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return func(ctx context.Context, sup *supervisor.Supervisor) error {
		s.sup = sup // before the stream runs: its rescans ask it
		if err := s.cdc.Run(ctx); err != nil {
			return fmt.Errorf("relay: the CDC stream of slot %s: %w", s.cdc.Slot(), err)
		}
		return nil
	}, nil
}

// open is table t's relay: its schema checked, its own router (CloudEvents' source
// and Debezium's columns are its own), its source (its store, or its part of the
// shared stream), its publisher (the shared one, or with exactly-once its own) and
// the dashboard's replays.
func (s *tableRelays) open(ctx context.Context, t outboxdriver.Table) (_ *supervisor.Table, err error) {
	drv := outboxpgx.New(s.pool, &t).WithShared(s.shared)
	m, err := drv.Migrator()
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, m, s.o.allowNewerSchema, s.o.logger.With("table", t.String())); err != nil {
		return nil, err
	}
	store, err := drv.Store()
	if err != nil {
		return nil, err
	}
	tb := &supervisor.Table{Source: store, Store: store, Config: *s.o.cfg}
	var cols []debezium.Column
	if len(s.o.format.debezium) > 0 {
		if cols, err = pgColumns(ctx, s.pool, t); err != nil {
			return nil, err
		}
	}
	if tb.Config.Router, err = s.o.format.router(t, cols); err != nil {
		return nil, err
	}
	// The dashboard's replays of this table go through the relay's topic template
	// and wire format, as a relay of the table alone has them.
	tmpl, err := broker.ParseTemplate(tb.Config.TopicTemplate)
	if err != nil {
		return nil, err
	}
	if s.cdc != nil {
		if tb.Source, err = s.cdc.Add(ctx, store, t); err != nil {
			return nil, err
		}
		tb.Gone = func(ctx context.Context) {
			if err := s.cdc.Remove(ctx, t); err != nil && ctx.Err() == nil {
				s.o.logger.Warn("relay: cannot take a table out of the CDC publication", "table", t.String(), "err", err)
			}
		}
	}
	if s.o.broker.kafkaTransactionalID != "" {
		pub, err := openBroker(ctx, s.o.brokerURL, s.o.broker.forTable(t))
		if err != nil {
			return nil, err
		}
		tb.Publisher, tb.Close = pub, func() { _ = pub.Close() }
	}
	tb.Replays = replay.NewRunner(replay.New(s.pool, t), s.pub, &replay.Config{Topic: tmpl, Router: tb.Config.Router})
	return tb, nil
}

// tablesWakeEvery is how often one statement asks which tables hold unpublished
// rows, and wakes their relays.
const tablesWakeEvery = time.Second

// wakePending wakes, every tablesWakeEvery until ctx ends, the relays of the tables
// that hold unpublished rows: the one path that tells the relays which tables have
// work besides their writers' notifications, which a writer coalesces (one per
// 50 ms) and a long transaction can outlive. Each relay's own poll is then only a
// rare backstop, and idle tables cost one probe each per statement.
func (s *tableRelays) wakePending(ctx context.Context, sup *supervisor.Supervisor) error {
	t := time.NewTicker(tablesWakeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		pending, err := outboxpgx.PendingTables(qctx, s.pool, sup.Tables()...)
		cancel()
		switch {
		case errors.Is(err, outboxdriver.ErrTableMissing):
			// A table dropped since the last rescan: the others' work still came
			// back; rescan now, so the next statement leaves it out.
			_ = sup.Scan(ctx)
		case err != nil:
			if ctx.Err() == nil {
				s.o.logger.Debug("relay: cannot ask which tables have work", "err", err)
			}
			continue
		}
		for _, tb := range pending {
			s.shared.Wake(tb)
		}
	}
}
