package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/internal/version"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
	"github.com/outboxd/outbox/replay"
)

// runRelayTables is `outbox relay --tables`: one relay per matching table in this
// process, each exactly as a relay of that table alone (its leadership, its order
// per aggregate, its dead letters, its completion), sharing one publisher, one pool
// (--max-conns), one session for the leadership locks and one for the wake-ups
// (poll mode) or one replication slot, publication and connection (CDC mode).
// Tables created or dropped are found every --tables-rescan.
func runRelayTables(ctx context.Context, o *relayOptions) error {
	logger := o.logger
	pool, sessions, err := openTablesPools(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	if sessions != pool {
		defer sessions.Close()
	}
	shared := outboxpgx.NewShared(sessions)
	defer shared.Close()
	o.broker.logger = logger
	// Shared by the tables' relays, and the dashboard's replays; with exactly-once,
	// each relay has a transactional publisher of its own (startTable).
	pub, err := startBroker(ctx, o.brokerURL, o.broker.outsideTransactions(), logger)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo(), prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_db_pool_connections",
		Help: "Database connections the relays' pool holds (in use, idle or opening), at most --max-conns."},
		func() float64 { return float64(pool.Stat().TotalConns()) }))
	retired, err := relayprom.NewRetiredTables(reg)
	if err != nil {
		return err
	}
	set := &tableRelays{o: o, pool: pool, shared: shared, pub: pub, reg: reg, running: map[string]*tableRelay{},
		retired: retired, retiredAt: map[string]time.Time{}, refused: map[string]bool{},
		rescan: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if o.mode == "cdc" {
		stopCDC, err := set.startCDC(ctx, sessions, cancel)
		if err != nil {
			return err
		}
		defer stopCDC() // after the relays stopped (deferred below): they report their last events first
	}
	defer set.stopAll()
	if o.httpAddr != "" {
		stop, err := set.serveHTTP(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	v := version.Get()
	logger.Info("relay starting", "version", v.Version, "revision", v.Short(), "mode", o.mode, "db", redact.URL(o.dsn),
		"broker", redact.Endpoint(o.brokerURL), "tables", patternsString(o.tables), "max_conns", pool.Config().MaxConns)
	for _, w := range plaintextWarnings(o.dsn, o.brokerURL) {
		logger.Warn(w)
	}
	if set.cdc == nil {
		// CDC relays wake up on the stream; polling ones on this.
		wctx, stopWake := context.WithCancel(ctx)
		wakeDone := make(chan struct{})
		go func() { defer close(wakeDone); set.wakePending(wctx) }()
		defer func() { stopWake(); <-wakeDone }()
	}
	t := time.NewTicker(o.tablesRescan)
	defer t.Stop()
	for {
		set.reconcile(ctx)
		select {
		case <-ctx.Done():
			if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
				return err // the CDC stream needs an operator
			}
			logger.Info("relay stopped", "tables", len(set.running))
			return nil
		case <-t.C:
		case <-set.rescan:
		}
	}
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

// tableRelays are the relays of the tables --tables matches.
type tableRelays struct {
	o      *relayOptions
	pool   *pgxpool.Pool
	shared *outboxpgx.Shared
	pub    broker.Publisher
	reg    *prometheus.Registry

	mu      sync.Mutex
	running map[string]*tableRelay // by table name
	failed  map[string]string      // tables that could not start, and why (logged once per error)
	rescan  chan struct{}          // a table went missing: reconcile before the next tick

	retired   *relayprom.RetiredTables
	retiredAt map[string]time.Time // when each table was let go (guarded by mu)

	cdc         *pgcdc.Shared   // CDC mode: the slot every table is read from (nil: poll mode)
	reconciling sync.Mutex      // one reconcile at a time: the rescan's, or the stream's
	refused     map[string]bool // tables refused as owned by others, with the reason: said once (guarded by reconciling)
}

// startCDC starts the stream of every table's events, from one slot and one
// publication (--slot, --publication; default outbox_tables) over one replication
// connection, direct (--leader-db) when --db goes through a proxy. A stream that
// needs an operator (a lost slot, wal_level) ends the relay with its error, through
// fail. stop ends the stream.
func (s *tableRelays) startCDC(ctx context.Context, direct *pgxpool.Pool, fail context.CancelCauseFunc) (stop func(), err error) {
	o := s.o
	patterns := o.tables
	s.cdc, err = pgcdc.NewShared(s.pool, &pgcdc.SharedConfig{Slot: o.cdc.Slot, Publication: o.cdc.Publication,
		MaxPending: o.cdc.MaxPending, MaxPendingBytes: o.cdc.MaxPendingBytes, RecreateSlot: o.cdc.RecreateSlot, ParkAfter: o.parkAfter,
		Logger: o.logger, Timeout: o.cfg.LeaderTimeout, Direct: direct,
		Match: func(t outboxdriver.Table) bool { return outboxdriver.MatchAny(patterns, t) },
		// Relays it starts live as long as the process, not the stream.
		Rescan: func(context.Context) error {
			s.reconcile(ctx)
			return ctx.Err()
		}})
	if err != nil {
		return nil, usageErr("%v", err)
	}
	// The tables matching now join before the stream starts: none of their
	// events are read unrouted.
	s.reconcile(ctx)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.cdc.Run(rctx); err != nil {
			fail(fmt.Errorf("relay: the CDC stream of slot %s: %w", s.cdc.Slot(), err))
		}
	}()
	return func() { cancel(); <-done }, nil
}

// tableRelay is one table's relay, running until stop.
type tableRelay struct {
	table   outboxdriver.Table
	r       *relay.Relay
	store   outboxdriver.Store
	status  relayprom.StatusReader // the metrics' and the dashboard's, one query per interval
	replays *replay.Runner         // the dashboard's replays of the table
	metrics *relayprom.Metrics
	regs    prometheus.Registerer
	cancel  context.CancelFunc
	done    chan struct{}
	// closePub closes the relay's own publisher (exactly-once: one per table).
	closePub func()
}

// sayRefused logs each table refused as owned by others, once per reason (the
// rescans find it again).
func (s *tableRelays) sayRefused(refused []outboxdriver.RefusedTable) {
	for _, r := range refused {
		key := r.Table.String() + "\x00" + r.Reason
		if !s.refused[key] {
			s.refused[key] = true
			s.o.logger.Error("relay: refusing a table owned by others; it is not relayed", "table", r.Table.String(), "reason", r.Reason)
		}
	}
}

// reconcile starts a relay for each table that matches and has none, and stops the
// relays of tables gone.
func (s *tableRelays) reconcile(ctx context.Context) {
	s.reconciling.Lock()
	defer s.reconciling.Unlock()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	tables, refused, err := outboxpgx.FindTrustedTables(fctx, s.pool, s.o.trustOwners, s.o.tables...)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.o.logger.Warn("relay: cannot list the outbox tables; trying again at the next rescan", "err", err)
		}
		return
	}
	s.sayRefused(refused)
	want := map[string]outboxdriver.Table{}
	for _, t := range tables {
		want[t.String()] = t
	}
	s.mu.Lock()
	var gone, unwanted []string
	var leaving []outboxdriver.Table
	for name, tr := range s.running {
		select {
		case <-tr.done: // ended on its own: started again below if still wanted
			gone = append(gone, name)
			continue
		default:
		}
		if _, ok := want[name]; !ok {
			gone = append(gone, name)
			unwanted = append(unwanted, name)
			leaving = append(leaving, tr.table)
		}
	}
	now := time.Now()
	for _, name := range unwanted {
		s.retiredAt[name] = now
		s.retired.Retire(name)
	}
	for name, at := range s.retiredAt {
		if _, back := want[name]; back || now.Sub(at) > retiredKept {
			delete(s.retiredAt, name)
			s.retired.Forget(name)
		}
	}
	s.mu.Unlock()
	for _, name := range gone {
		s.stop(name)
	}
	if s.cdc != nil {
		for _, t := range leaving {
			if err := s.cdc.Remove(ctx, t); err != nil && ctx.Err() == nil {
				s.o.logger.Warn("relay: cannot take a table out of the CDC publication", "table", t.String(), "err", err)
			}
		}
	}
	if len(tables) == 0 {
		s.o.logger.Warn("relay: no outbox table matches --tables", "tables", patternsString(s.o.tables))
	}
	for _, t := range tables {
		s.mu.Lock()
		_, ok := s.running[t.String()]
		s.mu.Unlock()
		if !ok && ctx.Err() == nil {
			s.start(ctx, t)
		}
	}
}

// retiredKept is how long a table let go is reported retired: longer than the
// alert rules look back for vanished series (an hour).
const retiredKept = 2 * time.Hour

// tablesWakeEvery is how often one statement asks which tables hold unpublished
// rows, and wakes their relays.
const tablesWakeEvery = time.Second

// wakePending wakes, every tablesWakeEvery until ctx ends, the relays of the tables
// that hold unpublished rows: the one path that tells the relays which tables have
// work besides their writers' notifications, which a writer coalesces (one per
// 50 ms) and a long transaction can outlive. Each relay's own poll is then only a
// rare backstop, and idle tables cost one probe each per statement.
func (s *tableRelays) wakePending(ctx context.Context) {
	t := time.NewTicker(tablesWakeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		tables := make([]outboxdriver.Table, 0, len(s.running))
		for _, tr := range s.running {
			tables = append(tables, tr.table)
		}
		s.mu.Unlock()
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		pending, err := outboxpgx.PendingTables(qctx, s.pool, tables...)
		cancel()
		switch {
		case errors.Is(err, outboxdriver.ErrTableMissing):
			// A table dropped since the last rescan: the others' work still came
			// back; rescan now, so the next statement leaves it out.
			select {
			case s.rescan <- struct{}{}:
			default:
			}
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

// start starts table t's relay; a table that cannot start (its schema unknown to
// this version, say) is logged and tried again at the next rescan, and the others
// go on.
func (s *tableRelays) start(ctx context.Context, t outboxdriver.Table) {
	logger := s.o.logger.With("table", t.String())
	fail := func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.failed == nil {
			s.failed = map[string]string{}
		}
		if s.failed[t.String()] != err.Error() {
			logger.Error("relay: cannot relay this table; trying again at the next rescan", "err", err)
			s.failed[t.String()] = err.Error()
		}
	}
	drv := outboxpgx.New(s.pool, &t).WithShared(s.shared)
	m, err := drv.Migrator()
	if err == nil {
		err = checkSchema(ctx, m, s.o.allowNewerSchema, logger)
	}
	if err != nil {
		fail(err)
		return
	}
	store, err := drv.Store()
	if err != nil {
		fail(err)
		return
	}
	regs := prometheus.WrapRegistererWith(prometheus.Labels{"table": t.String()}, s.reg)
	status := relayprom.NewStatusCache(store, relayprom.StatusCacheIntervalDefault)
	metrics, err := relayprom.New(regs, status)
	if err != nil {
		fail(err)
		return
	}
	cfg := *s.o.cfg // each table its own copy: relay.New fills defaults in
	cfg.Hooks, cfg.Logger = metrics, logger
	// The table's own router: CloudEvents' source and Debezium's columns are its own.
	var cols []debezium.Column
	if len(s.o.format.debezium) > 0 {
		cols, err = pgColumns(ctx, s.pool, t)
	}
	if err == nil {
		cfg.Router, err = s.o.format.router(t, cols)
	}
	if err != nil {
		metrics.Unregister(regs)
		fail(err)
		return
	}
	var src outboxdriver.Source = store
	if s.cdc != nil {
		if src, err = s.cdc.Add(ctx, store, t); err != nil {
			metrics.Unregister(regs)
			fail(err)
			return
		}
	}
	pub, closePub := s.pub, func() {}
	if s.o.broker.kafkaTransactionalID != "" {
		if pub, err = openBroker(ctx, s.o.brokerURL, s.o.broker.forTable(t)); err != nil {
			metrics.Unregister(regs)
			fail(err)
			return
		}
		closePub = func() { _ = pub.Close() }
	}
	r, err := relay.New(src, pub, &cfg)
	if err != nil {
		closePub()
		metrics.Unregister(regs)
		fail(err)
		return
	}
	// The dashboard's replays of this table go through the relay's publisher, topic
	// template and wire format, as a relay of the table alone has them.
	tmpl, err := broker.ParseTemplate(cfg.TopicTemplate)
	if err != nil {
		closePub()
		metrics.Unregister(regs)
		fail(err)
		return
	}
	replays := replay.NewRunner(replay.New(s.pool, t), s.pub, &replay.Config{Topic: tmpl, Router: cfg.Router})
	rctx, cancel := context.WithCancel(ctx)
	tr := &tableRelay{table: t, r: r, store: store, status: status, replays: replays, metrics: metrics, regs: regs,
		cancel: cancel, done: make(chan struct{}), closePub: closePub}
	go func() {
		defer close(tr.done)
		if err := r.Run(rctx); err != nil && rctx.Err() == nil {
			logger.Error("relay: stopped; starting it again at the next rescan", "err", err)
		}
	}()
	s.mu.Lock()
	s.running[t.String()] = tr
	delete(s.failed, t.String())
	s.mu.Unlock()
	logger.Info("relay: relaying table")
}

// stop stops table name's relay and waits for it.
func (s *tableRelays) stop(name string) {
	s.mu.Lock()
	tr := s.running[name]
	delete(s.running, name)
	s.mu.Unlock()
	if tr == nil {
		return
	}
	tr.cancel()
	<-tr.done
	tr.closePub()
	tr.replays.Stop(context.Background())
	tr.metrics.Unregister(tr.regs)
	s.o.logger.Info("relay: stopped relaying table", "table", name)
}

func (s *tableRelays) stopAll() {
	s.mu.Lock()
	names := make([]string, 0, len(s.running))
	for name := range s.running {
		names = append(names, name)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop(name) }()
	}
	wg.Wait()
}

// serveHTTP serves /metrics, /healthz and /readyz: ready while the database answers
// and no table's relay finds the broker down; the body says each table's role.
func (s *tableRelays) serveHTTP(ctx context.Context) (func(), error) {
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 3*time.Second)
		defer cancel()
		if err := s.pool.Ping(ctx); err != nil {
			http.Error(w, "database: "+redact.String(err.Error()), http.StatusServiceUnavailable)
			return
		}
		if err := brokerReady(ctx, s.pub); err != nil {
			http.Error(w, "broker: "+redact.String(err.Error()), http.StatusServiceUnavailable)
			return
		}
		s.mu.Lock()
		lines := make([]string, 0, len(s.running))
		var down []string
		for name, tr := range s.running {
			st := tr.r.Stats()
			role := "standby"
			if st.Leader {
				role = "active"
			}
			lines = append(lines, name+" "+role)
			if !st.BrokerDownSince.IsZero() {
				down = append(down, name)
			}
		}
		s.mu.Unlock()
		sort.Strings(lines)
		if len(down) > 0 {
			sort.Strings(down)
			http.Error(w, "broker unavailable for "+strings.Join(down, ", "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ready (%d tables)\n%s\n", len(lines), strings.Join(lines, "\n"))
	})
	what := "/metrics, /healthz and /readyz"
	dash, err := s.dashboard()
	if err != nil {
		return nil, err
	}
	var run sampler
	if dash != nil {
		mux.Handle(dashboard.PrefixDefault+"/", dash)
		mux.Handle("GET "+dashboard.PrefixDefault, dash)
		what += " and the dashboard of every table at /ui/"
		run = dash
	}
	return listenAndServe(ctx, s.o.httpAddr, mux, run, what, s.o.logger)
}

// dashboard is the dashboard of every table this process relays (nil when --ui is
// off, or --http leaves loopback without --ui-token): each table's pages show its
// relay's role and its broker's state.
func (s *tableRelays) dashboard() (*dashboard.Tables, error) {
	o := s.o
	if !o.ui {
		return nil, nil
	}
	if !loopbackAddr(o.httpAddr) && o.uiToken == "" {
		o.logger.Warn("relay: the dashboard is off: --http " + o.httpAddr + " is not loopback and there is no --ui-token (give one, keep --http on loopback, or run `outbox ui --tables` on a listener of its own)")
		return nil, nil
	}
	if w := uiTokenWarning(o.httpAddr, o.uiToken); w != "" {
		o.logger.Warn(w)
	}
	return dashboard.NewTables(&dashboard.TablesConfig{
		Find: func(context.Context) ([]outboxdriver.Table, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			tables := make([]outboxdriver.Table, 0, len(s.running))
			for _, tr := range s.running {
				tables = append(tables, tr.table)
			}
			slices.SortFunc(tables, func(a, b outboxdriver.Table) int { return strings.Compare(a.String(), b.String()) })
			return tables, nil
		},
		Table: func(t outboxdriver.Table) (*dashboard.Config, error) {
			s.mu.Lock()
			tr, ok := s.running[t.String()]
			s.mu.Unlock()
			if !ok {
				return nil, fmt.Errorf("%s is not relayed here", t)
			}
			return &dashboard.Config{Admin: tr.store, Status: tr.status, Relay: tr.r, Replays: tr.replays, Mode: o.mode,
				Metrics: s.reg, Broker: redact.Endpoint(o.brokerURL)}, nil
		},
		Token: o.uiToken, Hosts: o.uiHosts, Logger: o.logger})
}
