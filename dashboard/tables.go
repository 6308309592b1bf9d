package dashboard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outbox/internal/human"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay/relayprom"
)

// TablesConfig configures the dashboard of many outbox tables (`outbox ui --tables`,
// `outbox relay --tables`): one page listing every table with its backlog, its
// oldest waiting event, its dead letters and its relay, trouble first; each table's
// own pages (the Dashboard of that table alone) under Prefix/t/<schema.table>/; one
// sign-in for all of them.
type TablesConfig struct {
	// Find lists the tables to show. It is asked again for each overview, so a
	// table created or dropped shows up or goes without a restart. Required.
	Find func(ctx context.Context) ([]outboxdriver.Table, error)
	// Table returns the configuration of one table's dashboard (Admin required;
	// Prefix, Token, Hosts and Logger are the Tables' own). Required.
	Table func(t outboxdriver.Table) (*Config, error)
	// Token, Prefix, Hosts and Logger are as in Config, for every table.
	Token  string
	Prefix string
	Hosts  []string
	Logger *slog.Logger
	// Parallel bounds the status reads of one overview. Default 4.
	Parallel int
}

// Tables is an http.Handler serving the overview of many tables and each table's
// pages.
type Tables struct {
	cfg    TablesConfig
	shared shared
	front  *Dashboard // the host check, the sign-in and the pages drawn outside a table

	mu      sync.Mutex
	dash    map[string]*tableDash // by table name, created when first needed
	runCtx  context.Context       // set by Run: each table's sampling runs under it
	running sync.WaitGroup
}

type tableDash struct {
	d      *Dashboard
	cancel context.CancelFunc // its sampling (nil until Run)
}

// overviewStatusTTL is how long a table's status read for the overview is kept.
const overviewStatusTTL = 5 * time.Second

// NewTables builds the dashboard of many tables.
func NewTables(cfg *TablesConfig) (*Tables, error) {
	if cfg == nil || cfg.Find == nil || cfg.Table == nil {
		return nil, errors.New("dashboard: TablesConfig.Find and Table are required")
	}
	if err := checkToken(cfg.Token); err != nil {
		return nil, err
	}
	c := *cfg
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	c.Prefix = "/" + strings.Trim(c.Prefix, "/")
	if c.Parallel <= 0 {
		c.Parallel = 4
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	t := &Tables{cfg: c, shared: shared{auth: newAuth(c.Token), pages: pages, root: c.Prefix + "/", home: true, reads: make(chan struct{}, eventReadsMax)},
		dash: map[string]*tableDash{}}
	// The front dashboard draws no table (only its sign-in, its assets and the
	// overview are routed to it): its Admin is never asked.
	t.front, err = newDashboard(&Config{Admin: noAdmin{}, Prefix: c.Prefix, Hosts: c.Hosts, Logger: c.Logger}, t.shared)
	if err != nil {
		return nil, err
	}
	t.front.afterLogin = c.Prefix + "/"
	return t, nil
}

// Run samples, for each table's charts, while someone watches its pages, until ctx
// ends.
func (t *Tables) Run(ctx context.Context) {
	t.mu.Lock()
	t.runCtx = ctx
	for _, td := range t.dash {
		t.startSampling(td)
	}
	t.mu.Unlock()
	<-ctx.Done()
	t.running.Wait()
}

// startSampling runs td's sampling under Run's context. Called with mu held.
func (t *Tables) startSampling(td *tableDash) {
	if t.runCtx == nil || td.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(t.runCtx)
	td.cancel = cancel
	t.running.Add(1)
	go func() {
		defer t.running.Done()
		td.d.Run(ctx)
	}()
}

// ServeHTTP implements http.Handler.
func (t *Tables) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !t.front.hostAllowed(r.Host) {
		http.Error(w, "the dashboard does not answer to this host name (add it with --ui-host)", http.StatusMisdirectedRequest)
		return
	}
	p := t.cfg.Prefix
	path := r.URL.Path
	switch {
	case path == p || path == p+"/":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if path == p {
			http.Redirect(w, r, p+"/", http.StatusMovedPermanently)
			return
		}
		secure(http.HandlerFunc(t.overview)).ServeHTTP(w, r)
	case strings.HasPrefix(path, p+"/t/"):
		name, _, _ := strings.Cut(strings.TrimPrefix(path, p+"/t/"), "/")
		d, err := t.table(r.Context(), name)
		if err != nil {
			t.front.message(w, r, http.StatusNotFound, "No such table", err.Error())
			return
		}
		d.ServeHTTP(w, r)
	case strings.HasPrefix(path, p+"/static/") || path == p+"/login" || path == p+"/logout":
		// The assets and the sign-in are the front dashboard's: one session for
		// every table.
		t.front.ServeHTTP(w, r)
	default:
		t.front.message(w, r, http.StatusNotFound, "Not found", "No such page: a table's pages are under "+p+"/t/<schema.table>/.")
	}
}

// table returns the dashboard of the table named (schema.name), if Find lists it.
func (t *Tables) table(ctx context.Context, name string) (*Dashboard, error) {
	t.mu.Lock()
	td, ok := t.dash[name]
	t.mu.Unlock()
	if ok {
		return td.d, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tables, err := t.cfg.Find(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the tables: %w", err)
	}
	i := slices.IndexFunc(tables, func(tb outboxdriver.Table) bool { return tb.String() == name })
	if i < 0 {
		return nil, fmt.Errorf("no outbox table %q is shown here", name)
	}
	return t.open(tables[i])
}

// open returns table tb's dashboard, made on first use.
func (t *Tables) open(tb outboxdriver.Table) (*Dashboard, error) {
	name := tb.String()
	t.mu.Lock()
	defer t.mu.Unlock()
	if td, ok := t.dash[name]; ok {
		return td.d, nil
	}
	cfg, err := t.cfg.Table(tb)
	if err != nil {
		return nil, err
	}
	c := *cfg
	c.Prefix = t.cfg.Prefix + "/t/" + url.PathEscape(name)
	c.Token, c.Hosts, c.Logger = t.cfg.Token, t.cfg.Hosts, t.cfg.Logger.With("table", name)
	if c.Table == "" {
		c.Table = name
	}
	if c.Status == nil {
		// The overview reads every table's status each time it refreshes (every
		// 2 s while watched): many tables make a longer cache worth its staleness.
		c.Status = relayprom.NewStatusCache(c.Admin, overviewStatusTTL)
	}
	d, err := newDashboard(&c, t.shared)
	if err != nil {
		return nil, err
	}
	td := &tableDash{d: d}
	t.dash[name] = td
	t.startSampling(td)
	return d, nil
}

// forget drops the dashboards of tables no longer listed.
func (t *Tables) forget(listed []outboxdriver.Table) {
	keep := map[string]bool{}
	for _, tb := range listed {
		keep[tb.String()] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, td := range t.dash {
		if !keep[name] {
			if td.cancel != nil {
				td.cancel()
			}
			delete(t.dash, name)
		}
	}
}

// tableRow is one table's line of the overview.
type tableRow struct {
	Table, Link       string
	Unpublished       int64
	Oldest            string
	oldest            time.Duration
	Failing, Dead     int64
	Held              int64
	Relay, RelayClass string
	Error             string
}

type tablesData struct {
	Rows                     []tableRow
	Tables, Waiting, Trouble int
	Unpublished, Dead        int64
	FindErr                  string
}

// overview lists every table, trouble first: a table whose status cannot be read,
// then the oldest waiting event, then the dead letters.
func (t *Tables) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	var v tablesData
	tables, err := t.cfg.Find(ctx)
	if err != nil {
		v.FindErr = err.Error()
	}
	t.forget(tables)
	v.Rows = make([]tableRow, len(tables))
	sem := make(chan struct{}, t.cfg.Parallel)
	var wg sync.WaitGroup
	for i, tb := range tables {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			v.Rows[i] = t.row(ctx, tb)
		}()
	}
	wg.Wait()
	slices.SortStableFunc(v.Rows, func(a, b tableRow) int {
		return cmp.Or(
			cmp.Compare(len(b.Error), len(a.Error)), // errors first
			cmp.Compare(b.oldest, a.oldest), cmp.Compare(b.Dead, a.Dead), cmp.Compare(a.Table, b.Table))
	})
	v.Tables = len(v.Rows)
	for _, row := range v.Rows {
		v.Unpublished += row.Unpublished
		v.Dead += row.Dead
		if row.Unpublished > 0 {
			v.Waiting++
		}
		if row.Error != "" || row.RelayClass == "bad" {
			v.Trouble++
		}
	}
	p := t.front.base(r, "Tables", "tables")
	p.Table = fmt.Sprintf("%d tables", v.Tables)
	p.Data = v
	t.front.render(w, r, http.StatusOK, "tables", p)
}

// row reads one table's status through its dashboard (whose cache the table's own
// pages share).
func (t *Tables) row(ctx context.Context, tb outboxdriver.Table) tableRow {
	name := tb.String()
	row := tableRow{Table: name, Link: t.cfg.Prefix + "/t/" + url.PathEscape(name) + "/", Oldest: "–", Relay: "–"}
	d, err := t.open(tb)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	st, err := d.status.Status(ctx)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.Unpublished, row.Failing, row.Dead, row.Held = st.Unpublished, st.Failing, st.Dead, st.HeldKeys
	if st.Unpublished > 0 {
		row.oldest, row.Oldest = st.OldestAge, human.Age(st.OldestAge)
	}
	switch {
	case st.ActiveRelay != "":
		row.Relay, row.RelayClass = st.ActiveRelay, "ok"
	case len(st.Relays) > 0:
		row.Relay, row.RelayClass = fmt.Sprintf("%d in the group", len(st.Relays)), "ok"
	default:
		row.Relay, row.RelayClass = "none", "bad"
	}
	return row
}

// noAdmin is the front dashboard's Admin: it draws no table, so nothing asks it.
type noAdmin struct{ outboxdriver.Admin }
