package main

import (
	"context"
	"fmt"
	"io"
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
	fs := newFlags("ui", stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	listen := fs.String("listen", "127.0.0.1:9465", "address to serve the dashboard on; loopback unless you say otherwise")
	token := fs.String("ui-token", "", "the admin token that allows replay and purge (empty: read-only); prefer OUTBOX_UI_TOKEN_FILE")
	var hosts listFlag
	fs.Var(&hosts, "ui-host", "a host name the dashboard answers to besides localhost and IP addresses (repeatable)")
	metrics := fs.String("metrics", "", "comma-separated /metrics URLs of running relays, for the events/s and latency charts")
	tablesList := fs.String("tables", "", tablesFlagHelp+": a page listing every table, trouble first, and each table's own pages")
	fs.String("trust-owner", "", trustOwnerHelp)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *token != "" && len(*token) < dashboard.MinTokenLength {
		return usageErr("--ui-token: %d characters, want at least %d (a random one: openssl rand -hex 16)", len(*token), dashboard.MinTokenLength)
	}
	if *token == "" && !loopbackAddr(*listen) {
		// As the relay's --http: every payload and dead letter, to anyone who can reach it.
		return usageErr("--listen %s is not loopback and there is no --ui-token: the dashboard shows every payload; give a token (OUTBOX_UI_TOKEN_FILE), or keep it on loopback behind a TLS proxy", *listen)
	}
	logger, err := newLogger(stderr, *logLevel, "text")
	if err != nil {
		return err
	}
	var urls []string
	for _, u := range strings.Split(*metrics, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return usageErr("--metrics %s: want http(s)://HOST:PORT/metrics", redact.URL(u))
		}
		urls = append(urls, u)
	}
	var dash interface {
		http.Handler
		Run(context.Context)
	}
	what := ""
	if flagSet(fs, "tables") {
		many, err := openTables(ctx, fs, *dsn, *tablesList)
		if err != nil {
			return err
		}
		defer many.close()
		if _, err := many.find(ctx, false); err != nil {
			return err
		}
		dash, err = dashboard.NewTables(&dashboard.TablesConfig{
			Find: func(ctx context.Context) ([]outboxdriver.Table, error) { return many.find(ctx, false) },
			Table: func(t outboxdriver.Table) (*dashboard.Config, error) {
				store, _, err := many.driver(t)
				return &dashboard.Config{Admin: store, MetricsURLs: urls}, err
			},
			Token: *token, Logger: logger, Hosts: hosts})
		if err != nil {
			return err
		}
		what = "the tables " + patternsString(many.patterns)
	} else {
		db, table, err := openTable(ctx, *dsn, *tableName)
		if err != nil {
			return err
		}
		defer db.close()
		if _, err := db.store.Status(ctx); err != nil {
			return fmt.Errorf("%s: %w", table, err)
		}
		dash, err = dashboard.New(&dashboard.Config{Admin: db.store, MetricsURLs: urls, Table: table.String(), Token: *token, Logger: logger, Hosts: hosts})
		if err != nil {
			return err
		}
		what = table.String()
	}
	mux := http.NewServeMux()
	mux.Handle(dashboard.PrefixDefault+"/", dash)
	mux.Handle("GET "+dashboard.PrefixDefault, dash)
	mux.Handle("GET /{$}", http.RedirectHandler(dashboard.PrefixDefault+"/", http.StatusFound))
	if w := uiTokenWarning(*listen, *token); w != "" {
		logger.Warn(w)
	}
	stop, err := listenAndServe(ctx, *listen, mux, dash, "the dashboard at /ui/", logger)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(stdout, "dashboard for %s: http://%s/ui/ (Ctrl-C to stop)\n", what, *listen)
	<-ctx.Done()
	return nil
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
