// Package supervisor runs the relays of one process: one outbox table or many, each
// relayed exactly as a relay of that table alone (its leadership, its order per
// aggregate, its dead letters, its completion), behind one metrics registry, one
// readiness probe and one dashboard.
//
// It is the way to run a relay as a service: `outbox relay` is a thin shell over
// it, with --table (a fixed table, Config.Tables) or --tables (tables found again
// every rescan, Config.Find). What a table's relay is made of (its store or CDC
// source, its router, its publisher) comes from Config.Open; the supervisor starts
// the relay and gives it metrics; with Find, it starts a relay that failed again at
// the next rescan and lets a relay go when its table does; it answers /metrics,
// /healthz, /readyz and /ui/ for all of them (Handler). A relay embedded alone, with
// no HTTP, needs only package relay.
package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/version"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
	"github.com/outboxd/outbox/replay"
)

// RescanDefault is Config.Rescan's default.
const RescanDefault = 30 * time.Second

// A Table is what one table's relay is made of: Config.Open builds it.
type Table struct {
	// Source is what the relay claims from: the table's store, or a CDC source on
	// it. Required.
	Source outboxdriver.Source
	// Store serves the table's status (metrics, probes, the dashboard) and the
	// dashboard's dead-letter actions. Required.
	Store outboxdriver.Store
	// Publisher is the relay's publisher. Nil: Config.Publisher.
	Publisher broker.Publisher
	// Config is the relay's configuration. The supervisor sets its Hooks (the
	// table's metrics) and, when nil, its Logger (Config.Logger with the table).
	Config relay.Config
	// Replays, when set, lets the dashboard's admin replay the table's events.
	Replays *replay.Runner
	// Close releases what Open opened for this table alone, once its relay stopped.
	Close func()
	// Gone, when set, is called after Close when the table's relay stopped because
	// Find no longer lists the table (not when Run ends): a shared CDC stream takes
	// the table out of its publication.
	Gone func(ctx context.Context)
}

// Config configures a Supervisor. Give Tables or Find, and Open.
type Config struct {
	// Tables are the tables to relay, for the process's life. A table that cannot
	// be opened, or whose relay ends with an error, ends Run with that error.
	Tables []outboxdriver.Table
	// Find lists the tables to relay. It is asked at start and every Rescan (or at
	// once after Scan), so that a table created or dropped is relayed or let go
	// without a restart. A table that cannot be opened, or whose relay ends with an
	// error, is logged and tried again at the next rescan; the others go on.
	Find func(ctx context.Context) ([]outboxdriver.Table, error)
	// Rescan is how often Find is asked again. Default RescanDefault.
	Rescan time.Duration
	// Open builds table t's relay. Required.
	Open func(ctx context.Context, t outboxdriver.Table) (*Table, error)
	// Publisher is the tables' shared publisher, if they share one (a Table may
	// bring its own). Readiness waits for it, as for every table's own, to have
	// connected when it is a broker.Lazy.
	Publisher broker.Publisher
	// Ping tells whether the database answers, for /readyz. Nil: not asked.
	Ping func(ctx context.Context) error
	// Beside run beside the relays, given the supervisor, from once the first
	// tables are open until Run ends, and stop after the relays did (a shared CDC
	// stream, which the relays report their last events to; an HTTP listener
	// serving Handler). One that returns an error while Run's context goes on ends
	// Run with it.
	Beside []func(ctx context.Context, s *Supervisor) error
	// Registry receives every table's metrics, labelled with its table. Nil: a
	// registry of the supervisor's own (Registry returns it).
	Registry *prometheus.Registry
	// Dashboard, when set, serves the dashboard at /ui/ on Handler: a single fixed
	// table's pages, or else an overview of every table and each one's pages.
	Dashboard *DashboardConfig
	// Logger is the supervisor's, and each table's relay's (with the table).
	// Default: discard.
	Logger *slog.Logger
	// StartAttrs are added to the "relay starting" log line (the mode, the
	// database and the broker, without secrets).
	StartAttrs []any
}

// DashboardConfig is what the dashboard needs besides the tables.
type DashboardConfig struct {
	// Token, when set, lets whoever signs in with it replay and purge dead letters.
	Token string
	// Hosts are the host names the dashboard answers to besides localhost and IP
	// addresses (dashboard.Config.Hosts).
	Hosts []string
	// Mode and Broker describe what the pages show (Broker without secrets).
	Mode, Broker string
}

// Supervisor runs the relays of the configured tables until its Run's context
// ends.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	retired *relayprom.RetiredTables // with Find: tables let go
	scan    chan chan struct{}       // Scan's requests: reconcile now, then close the channel
	ended   chan struct{}            // a fixed table's relay ended on its own
	dash    *dashboards
	started chan struct{} // closed once the first tables are open
	quit    chan struct{} // closed once Run stops reconciling: Scan waits no more

	mu        sync.Mutex
	running   map[string]*tableRelay // by table name
	failed    map[string]string      // tables that could not start, and why (logged once per error)
	retiredAt map[string]time.Time   // when each table was let go
	totals    relay.Stats            // published and failed of the relays stopped
}

// tableRelay is one table's relay, running until stop.
type tableRelay struct {
	table   outboxdriver.Table
	t       *Table
	r       *relay.Relay
	status  *relayprom.StatusCache // the metrics', the probe's and the dashboard's: one query per interval
	metrics *relayprom.Metrics
	regs    prometheus.Registerer
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // Run's, once done
}

// New returns a supervisor of cfg's tables; Run runs it.
func New(cfg *Config) (*Supervisor, error) {
	if cfg == nil || cfg.Open == nil || (cfg.Find == nil) == (cfg.Tables == nil) {
		return nil, errors.New("supervisor: Config.Open and one of Tables and Find are required")
	}
	c := *cfg
	if c.Rescan <= 0 {
		c.Rescan = RescanDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	s := &Supervisor{cfg: c, log: c.Logger, reg: c.Registry, scan: make(chan chan struct{}), ended: make(chan struct{}, 1),
		started: make(chan struct{}), quit: make(chan struct{}), running: map[string]*tableRelay{}, failed: map[string]string{}, retiredAt: map[string]time.Time{}}
	if c.Find != nil {
		var err error
		if s.retired, err = relayprom.NewRetiredTables(c.Registry); err != nil {
			return nil, err
		}
	}
	if c.Dashboard != nil {
		var err error
		if s.dash, err = s.newDashboards(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Registry is the registry every table's metrics are in.
func (s *Supervisor) Registry() *prometheus.Registry { return s.reg }

// Run opens the tables and runs their relays until ctx ends. It returns nil when
// ctx ends, or the error that ended it: a fixed table that could not open or whose
// relay failed, or a Beside's. A Supervisor runs once.
func (s *Supervisor) Run(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	defer s.stopAll()
	if err := s.reconcile(ctx); err != nil {
		return err
	}
	close(s.started)
	v := version.Get()
	s.log.Info("relay starting", append([]any{"version", v.Version, "revision", v.Short(), "tables", s.tableNames()}, s.cfg.StartAttrs...)...)
	// Beside and the dashboard's sampling outlive the relays: stopped after them.
	bctx, stopBeside := context.WithCancel(context.WithoutCancel(ctx))
	var beside sync.WaitGroup
	defer func() { s.stopAll(); stopBeside(); beside.Wait() }()
	for _, f := range s.cfg.Beside {
		beside.Go(func() {
			if err := f(bctx, s); err != nil && bctx.Err() == nil {
				cancel(err)
			}
		})
	}
	if s.dash != nil {
		beside.Go(func() { s.dash.run(bctx) })
	}
	defer close(s.quit)
	var tick <-chan time.Time
	if s.cfg.Find != nil {
		t := time.NewTicker(s.cfg.Rescan)
		defer t.Stop()
		tick = t.C
	}
	for {
		var done chan struct{}
		select {
		case <-ctx.Done():
			if parent.Err() == nil {
				return context.Cause(ctx) // a Beside's error
			}
			st := s.stats()
			s.log.Info("relay stopped", "tables", len(s.tableNames()), "published", st.Published, "failed", st.Failed)
			return nil
		case <-tick:
		case <-s.ended:
		case done = <-s.scan:
		}
		err := s.reconcile(ctx)
		if done != nil {
			close(done)
		}
		if err != nil {
			return err
		}
	}
}

// Scan asks Run to look for tables now, and waits until it has (or ctx ends): a
// CDC stream that carries an event of a table not relayed yet calls it before
// reading on.
func (s *Supervisor) Scan(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case s.scan <- done:
	case <-s.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	errStopped = errors.New("supervisor: stopped")
	errEnded   = errors.New("ended on its own")
)

// Tables are the tables whose relays run, sorted.
func (s *Supervisor) Tables() []outboxdriver.Table {
	s.mu.Lock()
	defer s.mu.Unlock()
	tables := make([]outboxdriver.Table, 0, len(s.running))
	for _, tr := range s.running {
		tables = append(tables, tr.table)
	}
	sortTables(tables)
	return tables
}

func (s *Supervisor) tableNames() []string {
	var names []string
	for _, t := range s.Tables() {
		names = append(names, t.String())
	}
	return names
}

// stats sums the relays' counts, of the running ones and of those stopped.
func (s *Supervisor) stats() relay.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.totals
	for _, tr := range s.running {
		rs := tr.r.Stats()
		st.Published += rs.Published
		st.Failed += rs.Failed
	}
	return st
}

// reconcile starts a relay for each table wanted that has none, and stops the
// relays of the tables gone. Only Run's goroutine calls it. The error is a fixed
// table's (Config.Tables): with Find, a table that fails is tried again later.
func (s *Supervisor) reconcile(ctx context.Context) error {
	tables, err := s.wanted(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("relay: cannot list the outbox tables; trying again at the next rescan", "err", err)
		}
		return nil
	}
	want := map[string]bool{}
	for _, t := range tables {
		want[t.String()] = true
	}
	s.mu.Lock()
	var gone, unwanted []string
	var leaving []*tableRelay
	for name, tr := range s.running {
		select {
		case <-tr.done: // ended on its own: with Find, started again below if still wanted
			if s.cfg.Tables != nil {
				s.mu.Unlock()
				return fmt.Errorf("relay of %s: %w", name, cmp.Or(tr.err, errEnded))
			}
			gone = append(gone, name)
			continue
		default:
		}
		if !want[name] {
			gone = append(gone, name)
			unwanted = append(unwanted, name)
			leaving = append(leaving, tr)
		}
	}
	s.retire(unwanted, want)
	s.mu.Unlock()
	for _, name := range gone {
		s.stop(name)
	}
	for _, tr := range leaving {
		if tr.t.Gone != nil {
			tr.t.Gone(ctx)
		}
	}
	for _, t := range tables {
		s.mu.Lock()
		_, ok := s.running[t.String()]
		s.mu.Unlock()
		if ok || ctx.Err() != nil {
			continue
		}
		if err := s.start(ctx, t); err != nil {
			if s.cfg.Tables != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
			s.sayFailed(t, err)
		}
	}
	return nil
}

// wanted are the tables to relay now.
func (s *Supervisor) wanted(ctx context.Context) ([]outboxdriver.Table, error) {
	if s.cfg.Find == nil {
		return s.cfg.Tables, nil
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tables, err := s.cfg.Find(fctx)
	if err == nil && len(tables) == 0 {
		s.log.Warn("relay: no outbox table to relay")
	}
	return tables, err
}

// retiredKept is how long a table let go is reported retired: longer than the
// alert rules look back for vanished series (an hour).
const retiredKept = 2 * time.Hour

// retire reports the tables let go, and forgets those back or long gone (s.mu held).
func (s *Supervisor) retire(unwanted []string, want map[string]bool) {
	if s.retired == nil {
		return
	}
	now := time.Now()
	for _, name := range unwanted {
		s.retiredAt[name] = now
		s.retired.Retire(name)
	}
	for name, at := range s.retiredAt {
		if want[name] || now.Sub(at) > retiredKept {
			delete(s.retiredAt, name)
			s.retired.Forget(name)
		}
	}
}

// sayFailed logs a table that could not start, once per error (the rescans try it
// again).
func (s *Supervisor) sayFailed(t outboxdriver.Table, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed[t.String()] != err.Error() {
		s.log.Error("relay: cannot relay this table; trying again at the next rescan", "table", t.String(), "err", err)
		s.failed[t.String()] = err.Error()
	}
}

// start opens table t and starts its relay.
func (s *Supervisor) start(ctx context.Context, t outboxdriver.Table) (err error) {
	tb, err := s.cfg.Open(ctx, t)
	if err != nil {
		return err
	}
	closeTable := func() {
		if tb.Close != nil {
			tb.Close()
		}
	}
	defer func() {
		if err != nil {
			closeTable()
		}
	}()
	if tb.Source == nil || tb.Store == nil {
		return errors.New("supervisor: Open returned a Table without its Source or Store")
	}
	regs := prometheus.WrapRegistererWith(prometheus.Labels{"table": t.String()}, s.reg)
	status := relayprom.NewStatusCache(tb.Store, relayprom.StatusCacheIntervalDefault)
	metrics, err := relayprom.New(regs, status)
	if err != nil {
		return err
	}
	cfg := tb.Config // relay.New fills defaults in: each table its own copy
	cfg.Hooks = metrics
	if cfg.Logger == nil {
		cfg.Logger = s.log.With("table", t.String())
	}
	pub := tb.Publisher
	if pub == nil {
		pub = s.cfg.Publisher
	}
	r, err := relay.New(tb.Source, pub, &cfg)
	if err != nil {
		metrics.Unregister(regs)
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	tr := &tableRelay{table: t, t: tb, r: r, status: status, metrics: metrics, regs: regs, cancel: cancel, done: make(chan struct{})}
	tr.t.Publisher = pub
	if s.dash != nil {
		if err := s.dash.opened(s, tr); err != nil {
			cancel()
			metrics.Unregister(regs)
			return err
		}
	}
	go func() {
		err := r.Run(rctx)
		if rctx.Err() != nil {
			close(tr.done) // stopped
			return
		}
		tr.err = err
		close(tr.done) // before Run hears of it: its reconcile finds the relay ended
		if s.cfg.Find != nil {
			// Not at once: a relay that fails as it starts would be started again
			// in a tight loop.
			cfg.Logger.Error("relay: stopped; starting it again at the next rescan", "err", err)
			return
		}
		select {
		case s.ended <- struct{}{}: // a fixed table's relay ended: Run ends
		default:
		}
	}()
	s.mu.Lock()
	s.running[t.String()] = tr
	delete(s.failed, t.String())
	s.mu.Unlock()
	if s.cfg.Find != nil {
		cfg.Logger.Info("relay: relaying table")
	}
	return nil
}

// stop stops table name's relay and waits for it.
func (s *Supervisor) stop(name string) {
	s.mu.Lock()
	tr := s.running[name]
	delete(s.running, name)
	s.mu.Unlock()
	if tr == nil {
		return
	}
	tr.cancel()
	<-tr.done
	if tr.t.Replays != nil {
		tr.t.Replays.Stop(context.Background())
	}
	if tr.t.Close != nil {
		tr.t.Close()
	}
	tr.metrics.Unregister(tr.regs)
	st := tr.r.Stats()
	s.mu.Lock()
	s.totals.Published += st.Published
	s.totals.Failed += st.Failed
	s.mu.Unlock()
	if s.cfg.Find != nil {
		s.log.Info("relay: stopped relaying table", "table", name)
	}
}

// stopAll stops every relay, at once.
func (s *Supervisor) stopAll() {
	var wg sync.WaitGroup
	for _, t := range s.Tables() {
		wg.Go(func() { s.stop(t.String()) })
	}
	wg.Wait()
}

// relayOf is table name's running relay (nil: none).
func (s *Supervisor) relayOf(name string) *tableRelay {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[name]
}
