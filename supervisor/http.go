package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// Handler serves, for every table this supervisor relays:
//
//	/metrics  the registry (each table's series labelled with its table)
//	/healthz  200 while the process runs
//	/readyz   200 once the tables are open, while the database answers and no
//	          publisher is known to be down; the body gives each table's role
//	/ui/      the dashboard, with Config.Dashboard
func (s *Supervisor) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", s.serveReady)
	if s.dash != nil {
		mux.Handle(dashboard.PrefixDefault+"/", s.dash)
		mux.Handle("GET "+dashboard.PrefixDefault, s.dash)
	}
	return mux
}

// Ready is nil when the supervisor is ready to relay: its tables are open, the
// database answers (Config.Ping), every publisher has connected, and no table's
// relay finds its broker down. Otherwise it says what is not ready.
func (s *Supervisor) Ready(ctx context.Context) error {
	select {
	case <-s.started:
	default:
		return errNotReady("starting: the tables are not open yet")
	}
	if s.cfg.Ping != nil {
		if err := s.cfg.Ping(ctx); err != nil {
			return errNotReady("database: " + redact.String(err.Error()))
		}
	}
	if err := publisherReady(ctx, s.cfg.Publisher); err != nil {
		return errNotReady("broker: " + redact.String(err.Error()))
	}
	var down []string
	for _, t := range s.Tables() {
		tr := s.relayOf(t.String())
		if tr == nil {
			continue
		}
		if err := publisherReady(ctx, tr.t.Publisher); err != nil {
			return errNotReady("broker of " + t.String() + ": " + redact.String(err.Error()))
		}
		if since := tr.r.Stats().BrokerDownSince; !since.IsZero() {
			down = append(down, t.String()+" since "+since.UTC().Format(time.RFC3339))
		}
	}
	if len(down) > 0 {
		return errNotReady("broker unavailable for " + strings.Join(down, ", "))
	}
	return nil
}

type errNotReady string

func (e errNotReady) Error() string { return string(e) }

func (s *Supervisor) serveReady(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 3*time.Second)
	defer cancel()
	if err := s.Ready(ctx); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	tables := s.Tables()
	lines := make([]string, 0, len(tables))
	for _, t := range tables {
		if tr := s.relayOf(t.String()); tr != nil {
			lines = append(lines, t.String()+" "+role(tr.r.Stats()))
		}
	}
	noun := "tables"
	if len(lines) == 1 {
		noun = "table"
	}
	fmt.Fprintf(w, "ready (%d %s)\n%s\n", len(lines), noun, strings.Join(lines, "\n"))
}

func role(st relay.Stats) string {
	if st.Leader {
		return "active"
	}
	return "standby"
}

// publisherReady is nil once pub exists: one whose broker did not answer at start
// (broker.Lazy) is not ready until it does.
func publisherReady(ctx context.Context, pub broker.Publisher) error {
	if l, ok := pub.(*broker.Lazy); ok {
		return l.Ready(ctx)
	}
	return nil
}

func sortTables(tables []outboxdriver.Table) {
	slices.SortFunc(tables, func(a, b outboxdriver.Table) int { return strings.Compare(a.String(), b.String()) })
}

// dashboards is the dashboard: of a single fixed table, that table's pages (built
// once it is open); else the overview of every table running and each one's pages.
type dashboards struct {
	one  atomic.Pointer[dashboard.Dashboard] // a single fixed table's, once open
	many *dashboard.Tables
}

func (s *Supervisor) newDashboards() (*dashboards, error) {
	d, c := &dashboards{}, s.cfg.Dashboard
	if len(s.cfg.Tables) == 1 {
		return d, nil
	}
	var err error
	d.many, err = dashboard.NewTables(&dashboard.TablesConfig{
		Find: func(context.Context) ([]outboxdriver.Table, error) { return s.Tables(), nil },
		Table: func(t outboxdriver.Table) (*dashboard.Config, error) {
			tr := s.relayOf(t.String())
			if tr == nil {
				return nil, fmt.Errorf("%s is not relayed here", t)
			}
			return s.dashboardConfig(tr), nil
		},
		Token: c.Token, Hosts: c.Hosts, Logger: s.log})
	return d, err
}

// dashboardConfig is the dashboard of one table's relay.
func (s *Supervisor) dashboardConfig(tr *tableRelay) *dashboard.Config {
	c := s.cfg.Dashboard
	return &dashboard.Config{Admin: tr.t.Store, Status: tr.status, Relay: tr.r, Replays: tr.t.Replays, Metrics: s.reg,
		Table: tr.table.String(), Mode: c.Mode, Broker: c.Broker, Token: c.Token, Hosts: c.Hosts, Logger: s.log}
}

// opened builds a single fixed table's dashboard once its relay runs.
func (d *dashboards) opened(s *Supervisor, tr *tableRelay) error {
	if d.many != nil {
		return nil
	}
	one, err := dashboard.New(s.dashboardConfig(tr))
	if err != nil {
		return err
	}
	d.one.Store(one)
	return nil
}

func (d *dashboards) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.many != nil {
		d.many.ServeHTTP(w, r)
		return
	}
	one := d.one.Load()
	if one == nil {
		http.Error(w, "starting: the table is not open yet", http.StatusServiceUnavailable)
		return
	}
	one.ServeHTTP(w, r)
}

// run samples for the charts while the dashboard is watched, until ctx ends.
func (d *dashboards) run(ctx context.Context) {
	if d.many != nil {
		d.many.Run(ctx)
		return
	}
	if one := d.one.Load(); one != nil {
		one.Run(ctx)
	}
}
