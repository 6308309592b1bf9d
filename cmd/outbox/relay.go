package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/replay"
	"github.com/outboxd/outbox/supervisor"
)

// runRelay is `outbox relay`: flags to a validated configuration (before anything
// connects, relayflags.go), then what the relays share opened (the database, the
// broker) into a supervisor.Config of one table or many, then supervised (each
// table's relay, the HTTP endpoints) until ctx ends.
func runRelay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseRelayFlags(args, stderr)
	if err != nil {
		return err
	}
	open := tableSupervisor
	if o.tables != nil {
		open = tablesSupervisor
	}
	sc, closeAll, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer closeAll()
	return supervise(ctx, o, sc)
}

// supervise runs the relays sc opens (one table or many) under the process's
// metrics, dashboard and HTTP endpoints, until ctx ends.
func supervise(ctx context.Context, o *relayOptions, sc *supervisor.Config) error {
	logger := o.logger
	sc.Logger = logger
	if sc.Registry == nil {
		sc.Registry = prometheus.NewRegistry()
	}
	sc.Registry.MustRegister(buildInfo())
	sc.Dashboard = o.dashboard()
	sc.StartAttrs = append([]any{"mode", o.mode, "db", redact.URL(o.dsn), "broker", redact.Endpoint(o.brokerURL)}, sc.StartAttrs...)
	if o.httpAddr != "" {
		sc.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		what := "/metrics, /healthz and /readyz"
		if sc.Dashboard != nil {
			what += " and the dashboard at /ui/"
		}
		sc.Beside = append(sc.Beside, func(ctx context.Context, sup *supervisor.Supervisor) error {
			stop, err := listenAndServe(ctx, o.httpAddr, sup.Handler(), nil, what, logger)
			if err != nil {
				return err
			}
			<-ctx.Done()
			stop()
			return nil
		})
	}
	for _, w := range plaintextWarnings(o.dsn, o.brokerURL) {
		logger.Warn(w)
	}
	sup, err := supervisor.New(sc)
	if err != nil {
		return err
	}
	err = sup.Run(ctx)
	if errors.Is(err, outboxdriver.ErrNotSupported) {
		return usageErr("%v", err) // a setting this database cannot honour
	}
	return err
}

// dashboard is the relay's dashboard, or nil when --ui is off or --http leaves
// loopback without --ui-token.
func (o *relayOptions) dashboard() *supervisor.DashboardConfig {
	if !o.ui || o.httpAddr == "" {
		return nil
	}
	if !loopbackAddr(o.httpAddr) && o.uiToken == "" {
		// The metrics port leaves loopback so Prometheus can scrape it: the
		// dashboard (every payload, read-only) must not go with it unasked.
		o.logger.Warn("relay: the dashboard is off: --http " + o.httpAddr + " is not loopback and there is no --ui-token (give one, keep --http on loopback, or run `outbox ui` on a listener of its own)")
		return nil
	}
	if w := uiTokenWarning(o.httpAddr, o.uiToken); w != "" {
		o.logger.Warn(w)
	}
	return &supervisor.DashboardConfig{Token: o.uiToken, Hosts: o.uiHosts, Mode: o.mode, Broker: redact.Endpoint(o.brokerURL)}
}

// checkSchema refuses a table whose schema this relay does not know: older (a
// migration missing: the relay would use what is not there) or newer (migrated by a
// newer version: docs/upgrading.md). A table no migration made is relayed as it is,
// with a warning.
func checkSchema(ctx context.Context, m outboxdriver.Migrator, allowNewer bool, logger *slog.Logger) error {
	st, err := m.Schema(ctx)
	if err != nil {
		// A role without SELECT on the migrations table (granted before the check
		// existed: docs/security.md) is relayed as before, and told.
		logger.Warn("relay: cannot read the schema version; not checked (grant SELECT on the table's _migrations table)", "err", err)
		return nil
	}
	if !st.Managed {
		logger.Warn("relay: the table has no migrations table (made by hand or by another tool); its schema version is not checked", "known", st.Latest)
		return nil
	}
	err = st.Check()
	if errors.Is(err, outboxdriver.ErrSchemaAhead) && allowNewer {
		logger.Warn("relay: running on a schema a newer version migrated (--allow-newer-schema)", "err", err)
		return nil
	}
	return err
}

// closers close what a relay's startup opened, in reverse order.
type closers []func()

func (o *closers) add(close func()) { *o = append(*o, close) }

// close closes what was opened, the last first.
func (o closers) close() {
	for i := len(o) - 1; i >= 0; i-- {
		o[i]()
	}
}

// tableSupervisor opens --table's database and broker: the supervisor's one table,
// with its router bound to the table's columns, its CDC source, metrics, tracing and
// the dashboard's replays. closeAll closes what it opened.
func tableSupervisor(ctx context.Context, o *relayOptions) (_ *supervisor.Config, closeAll func(), err error) {
	var cl closers
	defer func() {
		if err != nil {
			cl.close()
		}
	}()
	cfg, logger, table := o.cfg, o.logger, o.table
	db, err := openDB(ctx, o.dsn, table, dbOptions{leaseTTL: o.leaseTTL, relay: true, leaderDSN: o.leaderDSN})
	if err != nil {
		return nil, nil, err
	}
	cl.add(db.close)
	if db.leaseTTL > 0 {
		cfg.LeaderCheck = min(relay.LeaderCheckDefault, db.leaseTTL/4) // renew well before it lapses
	}
	o.broker.logger = logger
	pub, err := startBroker(ctx, o.brokerURL, o.broker, logger)
	if err != nil {
		return nil, nil, err
	}
	cl.add(func() { _ = pub.Close() })
	tracer, stopTracing, err := tracerFromEnv(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	cl.add(stopTracing)
	if tracer != nil {
		cfg.Tracer = tracer
	}
	replayPub := pub // the dashboard's replays go outside Kafka transactions
	if db.replayer != nil && o.broker.kafkaTransactionalID != "" {
		if replayPub, err = startBroker(ctx, o.brokerURL, o.broker.outsideTransactions(), logger); err != nil {
			return nil, nil, err
		}
		cl.add(func() { _ = replayPub.Close() })
	}
	open := func(ctx context.Context, t outboxdriver.Table) (*supervisor.Table, error) {
		return openTableRelay(ctx, o, db, t, replayPub)
	}
	return &supervisor.Config{Tables: []outboxdriver.Table{table}, Open: open, Publisher: pub, Ping: db.ping}, cl.close, nil
}

// openTableRelay is --table's relay: checked (it answers, its schema is known), its
// router bound to its columns, and its source (the store, or its CDC stream).
func openTableRelay(ctx context.Context, o *relayOptions, db *database, t outboxdriver.Table, replayPub broker.Publisher) (*supervisor.Table, error) {
	cfg := *o.cfg
	if _, err := db.store.Status(ctx); err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, db.migrator, o.allowNewerSchema, o.logger); err != nil {
		return nil, err
	}
	if len(o.format.debezium) > 0 && db.columns != nil {
		// Bound to the table: its column types make the converters' schemas exact,
		// and a custom column the options name must exist. (Custom columns off
		// PostgreSQL: relay.New refuses them, as the store declares.)
		cols, err := db.columns(ctx)
		if err != nil {
			return nil, err
		}
		if cfg.Router, err = o.format.router(t, cols); err != nil {
			return nil, usageErr("--config %s: %v", o.configPath, err)
		}
	}
	tb := &supervisor.Table{Source: db.store, Store: db.store, Config: cfg}
	if o.mode == "cdc" {
		o.cdc.Logger = o.logger
		src, err := db.cdc(&o.cdc)
		if err != nil {
			return nil, usageErr("%v", err)
		}
		tb.Source = src
	}
	if db.replayer != nil {
		// The dashboard's replays go through the relay's publisher, topic template and
		// wire format.
		tmpl, err := broker.ParseTemplate(cfg.TopicTemplate)
		if err != nil {
			return nil, err
		}
		tb.Replays = replay.NewRunner(db.replayer(), replayPub, &replay.Config{Topic: tmpl, Router: cfg.Router})
	}
	return tb, nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usageErr("--log-level %q: want debug, info, warn or error", level)
	}
	// Every string and error a log line carries goes through the one redaction path:
	// a driver's error can quote a DSN.
	opts := &slog.HandlerOptions{Level: l, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		switch a.Value.Kind() {
		case slog.KindString:
			a.Value = slog.StringValue(redact.String(a.Value.String()))
		case slog.KindAny:
			if err, ok := a.Value.Any().(error); ok {
				a.Value = slog.StringValue(redact.String(err.Error()))
			}
		}
		return a
	}}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErr("--log-format %q: want text or json", format)
}
