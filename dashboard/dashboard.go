// Package dashboard serves the outbox's web UI: the backlog and its flow, the
// relays and their partitions (or CDC slots), the dead letters with replay and
// purge, and one event's story. Pages are rendered on the server (html/template:
// every value a row carries is escaped) with their assets embedded, so it works
// offline and needs no front-end build; a small script refreshes the live parts.
//
// NewTables serves many tables at once: a page listing every table, trouble first,
// and each table's own pages under /ui/t/<schema.table>/, with one sign-in.
//
// It is read-only unless Config.Token is set: whoever signs in with the token may
// replay and purge, by POSTs that carry the session's CSRF token and pass Go's
// cross-origin protection.
//
// The relay CLI serves it under /ui/ on its --http listener; `outbox ui` serves it
// for a database with no relay in the process. A program embedding the relay can
// mount it on its own mux:
//
//	d, err := dashboard.New(&dashboard.Config{Admin: store, Metrics: registry, Relay: r})
//	go d.Run(ctx)
//	mux.Handle("/ui/", d)
package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relayprom"
	"github.com/outboxd/outbox/replay"
)

// Defaults.
const (
	PrefixDefault         = "/ui"
	SampleIntervalDefault = 2 * time.Second
	// HistoryDefault is how far back the charts go.
	HistoryDefault = 5 * time.Minute
	// WatchWindow is how long after the last page served the dashboard keeps
	// sampling.
	WatchWindow = 10 * time.Minute
)

// Config configures a Dashboard.
type Config struct {
	// Admin reads the table's status, dead letters and events, and replays and
	// purges dead letters. Required.
	Admin outboxdriver.Admin
	// Status, when set, is read for the status instead of Admin (the relay's
	// relayprom.StatusCache: pages, probes and scrapes then share one query per
	// interval). Default: a cache of Admin.Status of its own.
	Status relayprom.StatusReader
	// Metrics is the registry of a relay in this process; MetricsURLs are relays'
	// /metrics endpoints. Either gives the flow charts (events/s, commit→broker
	// latency), summed over every relay named; of series labelled with a table, only
	// Table's count (a relay of many tables reports them all).
	Metrics     prometheus.Gatherer
	MetricsURLs []string
	// Relay is the relay in this process, if any: its role and the broker's state.
	Relay interface{ Stats() relay.Stats }
	// Table, Mode and Broker describe what the pages show (Broker without secrets).
	Table, Mode, Broker string
	// Token, when set, lets whoever signs in with it replay and purge dead letters.
	// Empty: read-only.
	Token string
	// Prefix is the path the dashboard is served under. Default PrefixDefault.
	Prefix string
	// SampleInterval is how often Run samples the status and the metrics. Default
	// SampleIntervalDefault.
	SampleInterval time.Duration
	// Logger records the actions taken (replay, purge, sign-in). Default: discard.
	Logger *slog.Logger
	// Replays, when set, lets an admin start, watch and stop `outbox replay` runs
	// (the relay's dashboard: it has the broker). Nil: the page says where to run one.
	Replays *replay.Runner
	// Hosts are the host names the dashboard answers to besides localhost and IP
	// addresses (the name a proxy or a browser uses for it). A request for another
	// name is refused: a page of another site whose name was made to resolve to this
	// address (DNS rebinding) cannot read the dashboard.
	Hosts []string
}

// Dashboard is an http.Handler serving the UI under its prefix.
type Dashboard struct {
	cfg     Config
	shared  shared
	status  relayprom.StatusReader
	flow    flowSource
	hist    history
	auth    *auth
	pages   map[string]*template.Template
	handler http.Handler
	log     *slog.Logger
	now     func() time.Time
	viewed  atomic.Int64 // unix nanoseconds of the last page served
	// afterLogin is where a sign-in lands ("": the dead letters).
	afterLogin string
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// shared is what the dashboards of many tables (Tables) have in common: one sign-in
// for all of them, one parsed set of pages, and the page that lists them.
type shared struct {
	auth  *auth
	pages map[string]*template.Template
	root  string // the path the session cookie is for ("/ui/"); Home links there
	home  bool   // the pages link to the overview of every table
	// reads admits the reads of a whole event (its page, its payload's download),
	// eventReadsMax at once for every table: a payload is read whole, and a few big
	// dead letters viewed at once must not take the process's memory.
	reads chan struct{}
}

// eventReadsMax is how many whole events the dashboard reads at once.
const eventReadsMax = 2

// New builds a dashboard.
func New(cfg *Config) (*Dashboard, error) {
	if cfg == nil || cfg.Admin == nil {
		return nil, errors.New("dashboard: Config.Admin is required")
	}
	if err := checkToken(cfg.Token); err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	return newDashboard(cfg, shared{auth: newAuth(cfg.Token), pages: pages, reads: make(chan struct{}, eventReadsMax)})
}

func checkToken(token string) error {
	if token != "" && len(token) < MinTokenLength {
		return fmt.Errorf("dashboard: the admin token has %d characters, want at least %d (a random one: openssl rand -hex 16)", len(token), MinTokenLength)
	}
	return nil
}

func newDashboard(cfg *Config, sh shared) (*Dashboard, error) {
	c := *cfg
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	c.Prefix = "/" + strings.Trim(c.Prefix, "/")
	if sh.root == "" {
		sh.root = c.Prefix + "/"
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = SampleIntervalDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Dashboard{
		cfg:    c,
		shared: sh,
		status: c.Status,
		flow:   flowSource{gatherer: c.Metrics, urls: c.MetricsURLs, client: &http.Client{Timeout: 5 * time.Second}, table: c.Table},
		hist:   history{max: int(HistoryDefault/c.SampleInterval) + 1},
		auth:   sh.auth,
		pages:  sh.pages,
		log:    c.Logger,
		now:    time.Now,
	}
	if d.status == nil {
		d.status = relayprom.NewStatusCache(c.Admin, time.Second)
	}
	static, _ := fs.Sub(staticFS, "static")
	p := c.Prefix
	mux := http.NewServeMux()
	mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", cacheFor(time.Hour, http.FileServerFS(static))))
	mux.HandleFunc("GET "+p+"/{$}", d.overview)
	mux.HandleFunc("GET "+p+"/relays", d.relays)
	mux.HandleFunc("GET "+p+"/dead", d.dead)
	mux.HandleFunc("POST "+p+"/dead/action", d.deadAction)
	mux.HandleFunc("GET "+p+"/events", d.findEvent)
	mux.HandleFunc("GET "+p+"/events/{id}", d.event)
	mux.HandleFunc("GET "+p+"/events/{id}/payload", d.eventPayload)
	mux.HandleFunc("POST "+p+"/events/{id}/edit", d.editDead)
	mux.HandleFunc("GET "+p+"/replay", d.replayPage)
	mux.HandleFunc("POST "+p+"/replay/start", d.replayStart)
	mux.HandleFunc("POST "+p+"/replay/stop", d.replayStop)
	mux.HandleFunc("GET "+p+"/login", d.loginPage)
	mux.HandleFunc("POST "+p+"/login", d.login)
	mux.HandleFunc("POST "+p+"/logout", d.logout)
	mux.HandleFunc(p+"/", func(w http.ResponseWriter, r *http.Request) {
		d.message(w, r, http.StatusNotFound, "Not found", "No such page.")
	})
	mux.Handle("GET "+p, http.RedirectHandler(p+"/", http.StatusMovedPermanently))
	d.handler = secure(http.NewCrossOriginProtection().Handler(mux))
	return d, nil
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !d.hostAllowed(r.Host) {
		http.Error(w, "the dashboard does not answer to this host name (add it with --ui-host)", http.StatusMisdirectedRequest)
		return
	}
	d.viewed.Store(d.now().UnixNano())
	d.handler.ServeHTTP(w, r)
}

// Run samples the status and the relays' metrics for the charts until ctx ends,
// while someone watches: the status counts the table, and a relay whose dashboard
// nobody opens must not pay for it. Sampling stops WatchWindow after the last page
// served and starts again with the next one.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.SampleInterval)
	defer t.Stop()
	for {
		if d.now().Sub(time.Unix(0, d.viewed.Load())) < WatchWindow {
			d.sample(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Dashboard) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s := sample{at: d.now()}
	s.status, s.statusErr = d.status.Status(ctx)
	if d.flow.enabled() {
		if f, err := d.flow.read(ctx); err == nil {
			s.flow = f
		} else {
			d.log.Debug("dashboard: reading relay metrics", "err", err)
		}
	}
	d.hist.add(s)
}

// secure sets the headers every response carries: no script but ours, no framing
// (the action buttons cannot be clickjacked), no sniffing, no referrer.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

func cacheFor(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(d.Seconds())))
		h.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a request's Host names the dashboard: an IP address
// (no DNS involved), localhost, or one of Config.Hosts.
func (d *Dashboard) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, h := range d.cfg.Hosts {
		if strings.EqualFold(host, h) {
			return true
		}
	}
	return false
}
