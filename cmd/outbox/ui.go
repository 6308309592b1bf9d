package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
)

// runUI serves the dashboard for a table with no relay in this process: status,
// relays, dead letters and events from the database, and the flow from relays'
// /metrics when --metrics names them.
func runUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &uiFlags{}
	fs := newFlags("ui", stderr)
	o.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	urls, err := o.validate()
	if err != nil {
		return err
	}
	logger, err := newLogger(stderr, o.logLevel, "text")
	if err != nil {
		return err
	}
	dash, what, closeDB, err := o.dashboard(ctx, fs, urls, logger)
	if err != nil {
		return err
	}
	defer closeDB()
	mux := http.NewServeMux()
	mux.Handle(dashboard.PrefixDefault+"/", dash)
	mux.Handle("GET "+dashboard.PrefixDefault, dash)
	mux.Handle("GET /{$}", http.RedirectHandler(dashboard.PrefixDefault+"/", http.StatusFound))
	if w := uiTokenWarning(o.listen, o.token); w != "" {
		logger.Warn(w)
	}
	stop, err := listenAndServe(ctx, o.listen, mux, dash, "the dashboard at /ui/", logger)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(stdout, "dashboard for %s: http://%s/ui/ (Ctrl-C to stop)\n", what, o.listen)
	<-ctx.Done()
	return nil
}

// uiFlags are ui's flags.
type uiFlags struct {
	dsn, table                     *string
	listen, token, metrics, tables string
	logLevel                       string
	hosts                          listFlag
}

func (o *uiFlags) register(fs *flag.FlagSet) {
	o.dsn, o.table = dbTableFlags(fs, dbFlagHelp)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9465", "address to serve the dashboard on; loopback unless you say otherwise")
	fs.StringVar(&o.token, "ui-token", "", "the admin token that allows replay and purge (empty: read-only); prefer OUTBOX_UI_TOKEN_FILE")
	fs.Var(&o.hosts, "ui-host", "a host name the dashboard answers to besides localhost and IP addresses (repeatable)")
	fs.StringVar(&o.metrics, "metrics", "", "comma-separated /metrics URLs of running relays, for the events/s and latency charts")
	fs.StringVar(&o.tables, "tables", "", tablesFlagHelp+": a page listing every table, trouble first, and each table's own pages")
	fs.String("trust-owner", "", trustOwnerHelp)
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
}

// validate checks the token against the address and returns the relays' /metrics URLs.
func (o *uiFlags) validate() ([]string, error) {
	if o.token != "" && len(o.token) < dashboard.MinTokenLength {
		return nil, usageErr("--ui-token: %d characters, want at least %d (a random one: openssl rand -hex 16)", len(o.token), dashboard.MinTokenLength)
	}
	if o.token == "" && !loopbackAddr(o.listen) {
		// As the relay's --http: every payload and dead letter, to anyone who can reach it.
		return nil, usageErr("--listen %s is not loopback and there is no --ui-token: the dashboard shows every payload; give a token (OUTBOX_UI_TOKEN_FILE), or keep it on loopback behind a TLS proxy", o.listen)
	}
	var urls []string
	for _, u := range strings.Split(o.metrics, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, usageErr("--metrics %s: want http(s)://HOST:PORT/metrics", redact.URL(u))
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// uiDashboard is a dashboard of one table or of many.
type uiDashboard interface {
	http.Handler
	Run(context.Context)
}

// dashboard opens the database and builds the dashboard of --tables or of --table,
// and says what it shows; closeDB closes the database once it is no longer served.
func (o *uiFlags) dashboard(ctx context.Context, fs *flag.FlagSet, urls []string, logger *slog.Logger) (dash uiDashboard, what string, closeDB func(), err error) {
	if flagSet(fs, "tables") {
		many, err := openTables(ctx, fs, *o.dsn, o.tables)
		if err != nil {
			return nil, "", nil, err
		}
		if _, err := many.find(ctx, false); err != nil {
			many.close()
			return nil, "", nil, err
		}
		dash, err := dashboard.NewTables(&dashboard.TablesConfig{
			Find: func(ctx context.Context) ([]outboxdriver.Table, error) { return many.find(ctx, false) },
			Table: func(t outboxdriver.Table) (*dashboard.Config, error) {
				store, _, err := many.driver(t)
				return &dashboard.Config{Admin: store, MetricsURLs: urls}, err
			},
			Token: o.token, Logger: logger, Hosts: o.hosts})
		if err != nil {
			many.close()
			return nil, "", nil, err
		}
		return dash, "the tables " + patternsString(many.patterns), many.close, nil
	}
	db, table, err := openTable(ctx, *o.dsn, *o.table)
	if err != nil {
		return nil, "", nil, err
	}
	if _, err := db.store.Status(ctx); err != nil {
		db.close()
		return nil, "", nil, fmt.Errorf("%s: %w", table, err)
	}
	d, err := dashboard.New(&dashboard.Config{Admin: db.store, MetricsURLs: urls, Table: table.String(), Token: o.token, Logger: logger, Hosts: o.hosts})
	if err != nil {
		db.close()
		return nil, "", nil, err
	}
	return d, table.String(), db.close, nil
}

// loopbackAddr reports whether a listen address is on loopback only.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && loopbackHost(host)
}

// uiTokenWarning says when the dashboard's admin token (and its session cookie)
// would cross a network in clear: a listener that is not loopback serves plain HTTP.
func uiTokenWarning(addr, token string) string {
	host, _, err := net.SplitHostPort(addr)
	if token == "" || (err == nil && host != "" && loopbackHost(host)) {
		return ""
	}
	return "the dashboard's admin token and session cookie travel in clear on " + addr +
		": keep it on loopback and put a TLS proxy in front (docs/dashboard.md)"
}
