package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// tablesFlagHelp is the --tables help of every command that takes it.
const tablesFlagHelp = "many outbox tables instead of --table (PostgreSQL, MySQL, SQLite), a comma-separated list of [schema.]name, where * stands for any characters (tenant_*.outbox)"

// flagSet reports whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// trustOwnerHelp is --trust-owner's help, for every command with --tables.
const trustOwnerHelp = "with --tables on PostgreSQL: roles trusted to own the matched tables, comma-separated, besides the current role and the roles granted to it; a table owned by another role, or carrying a trigger, rule or row-level security policy, is refused (docs/security.md)"

// trustedOwners reads fs's --trust-owner.
func trustedOwners(fs *flag.FlagSet) []string {
	f := fs.Lookup("trust-owner")
	if f == nil {
		return nil
	}
	var out []string
	for _, r := range strings.Split(f.Value.String(), ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// manyTables is an opened --tables: one connection pool, the tables it names.
type manyTables struct {
	patterns []outboxdriver.TablePattern
	// home is the schema a pattern without one means: public on PostgreSQL, the
	// URL's database on MySQL, main on SQLite.
	home string
	// findTables lists the database's outbox tables that match patterns, and those
	// of them refused as owned by others (PostgreSQL: FindTrustedTables).
	findTables func(ctx context.Context) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error)
	// warn is where a refused table is said (the command's stderr).
	warn io.Writer
	// refused are the tables refused by the last find; said, those already said (a
	// dashboard finds the tables at every view).
	mu      sync.Mutex // guards refused and said: a dashboard's views find at once
	refused []outboxdriver.RefusedTable
	said    map[string]bool
	// driver opens one table's store and migrator on the shared pool.
	driver func(t outboxdriver.Table) (outboxdriver.Store, outboxdriver.Migrator, error)
	close  func()
	// pg is the pool on PostgreSQL (nil elsewhere).
	pg *pgxpool.Pool
}

// openTables parses --tables and opens the database at dsn (PostgreSQL or MySQL).
func openTables(ctx context.Context, fs *flag.FlagSet, dsn, list string) (*manyTables, error) {
	if flagSet(fs, "table") {
		return nil, usageErr("--table and --tables: give one of them")
	}
	patterns, err := outboxdriver.ParseTablePatterns(list)
	if err != nil {
		return nil, usageErr("--tables: %v", err)
	}
	m := &manyTables{patterns: patterns, home: outboxdriver.DefaultSchema, warn: fs.Output(), said: map[string]bool{}}
	switch scheme, _, _ := strings.Cut(dsn, "://"); scheme {
	case "postgres", "postgresql":
		pool, err := openPool(ctx, "--db", dsn, false)
		if err != nil {
			return nil, err
		}
		m.close, m.pg = pool.Close, pool
		trust := trustedOwners(fs)
		m.findTables = func(ctx context.Context) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error) {
			return outboxpgx.FindTrustedTables(ctx, pool, trust, patterns...)
		}
		m.driver = func(t outboxdriver.Table) (outboxdriver.Store, outboxdriver.Migrator, error) {
			return storeAndMigrator(outboxpgx.New(pool, &t))
		}
	case "mysql":
		db, err := openMySQLDB(ctx, dsn)
		if err != nil {
			return nil, err
		}
		m.close = func() { _ = db.Close() }
		if err := db.QueryRowContext(ctx, "SELECT coalesce(DATABASE(), ?)", outboxdriver.DefaultSchema).Scan(&m.home); err != nil {
			m.close()
			return nil, err
		}
		m.findTables = func(ctx context.Context) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error) {
			tables, err := outboxmysql.FindTables(ctx, db, patterns...)
			return tables, nil, err
		}
		m.driver = func(t outboxdriver.Table) (outboxdriver.Store, outboxdriver.Migrator, error) {
			if t.Schema == outboxdriver.DefaultSchema {
				t.Schema = "" // the database of the URL
			}
			return storeAndMigrator(outboxmysql.New(db, &t))
		}
	case "sqlite":
		path := sqlitePath(dsn)
		if path == "" {
			return nil, usageErr("--db sqlite://PATH: the path is empty")
		}
		db, err := outboxsqlite.Open(path)
		if err != nil {
			return nil, err
		}
		m.close, m.home = func() { _ = db.Close() }, "main"
		m.findTables = func(ctx context.Context) ([]outboxdriver.Table, []outboxdriver.RefusedTable, error) {
			tables, err := outboxsqlite.FindTables(ctx, db, patterns...)
			return tables, nil, err
		}
		m.driver = func(t outboxdriver.Table) (outboxdriver.Store, outboxdriver.Migrator, error) {
			return storeAndMigrator(outboxsqlite.New(db, &outboxsqlite.Options{Table: t}))
		}
	default:
		return nil, usageErr("--tables needs PostgreSQL, MySQL or SQLite (--db postgres://..., mysql://... or sqlite://PATH): name one table with --table on %s", redact.URL(dsn))
	}
	return m, nil
}

// storeAndMigrator opens a driver's store and migrator.
func storeAndMigrator[TTx any](d outboxdriver.Driver[TTx]) (outboxdriver.Store, outboxdriver.Migrator, error) {
	s, err := d.Store()
	if err != nil {
		return nil, nil, err
	}
	m, err := d.Migrator()
	return s, m, err
}

// find returns the outbox tables that match, and with create the tables that the
// literal patterns name even where they do not exist yet (for migrate), in order.
func (m *manyTables) find(ctx context.Context, create bool) ([]outboxdriver.Table, error) {
	found, refused, err := m.findTables(ctx)
	if err != nil {
		return nil, fmt.Errorf("finding the outbox tables: %w", err)
	}
	m.mu.Lock()
	m.refused = refused
	for _, r := range refused {
		if key := r.Table.String() + "\x00" + r.Reason; !m.said[key] {
			m.said[key] = true
			fmt.Fprintf(m.warn, "outbox: refusing table %s: %s\n", safetext.Display(r.Table.String()), safetext.Display(r.Reason))
		}
	}
	m.mu.Unlock()
	if !create {
		return found, nil
	}
	have := map[string]bool{}
	for _, t := range found {
		have[t.String()] = true
	}
	for _, r := range refused { // it exists: refused, not created anew
		have[r.Table.String()] = true
	}
	for _, p := range m.patterns {
		t := p.Table()
		if t.Schema == outboxdriver.DefaultSchema {
			t.Schema = m.home
		}
		if p.Literal() && !have[t.String()] {
			found = append(found, t)
			have[t.String()] = true
		}
	}
	return found, nil
}

// tablesOverview prints one line per table of `outbox status --tables`.
func tablesOverview(ctx context.Context, m *manyTables, asJSON bool, stdout io.Writer) error {
	tables, err := m.find(ctx, false)
	if err != nil {
		return err
	}
	type row struct {
		Table            string  `json:"table"`
		Unpublished      int64   `json:"unpublished"`
		OldestAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
		Failing          int64   `json:"failing"`
		Dead             int64   `json:"dead_letters"`
		HeldAggregates   int64   `json:"held_aggregates"`
		PublishedKept    int64   `json:"published_kept"`
		ActiveRelay      string  `json:"active_relay"`
		Error            string  `json:"error,omitempty"`
	}
	rows := []row{}
	failed := 0
	for _, t := range tables {
		r := row{Table: t.String()}
		st, err := m.status(ctx, t)
		if err != nil {
			// One table's trouble (dropped meanwhile, no grant) is its line's, not
			// the overview's.
			r.Error = err.Error()
			failed++
		} else {
			r.Unpublished, r.OldestAgeSeconds, r.Failing = st.Unpublished, st.OldestAge.Seconds(), st.Failing
			r.Dead, r.HeldAggregates, r.PublishedKept, r.ActiveRelay = st.Dead, st.HeldKeys, st.Published, st.ActiveRelay
		}
		rows = append(rows, r)
	}
	if asJSON {
		if err := printJSON(stdout, struct {
			Tables []row `json:"tables"`
		}{rows}); err != nil {
			return err
		}
	} else {
		if len(rows) == 0 {
			fmt.Fprintf(stdout, "no outbox table matches %s\n", patternsString(m.patterns))
			return nil
		}
		w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "TABLE\tUNPUBLISHED\tOLDEST\tFAILING\tDEAD\tHELD\tACTIVE RELAY")
		for _, r := range rows {
			if r.Error != "" {
				fmt.Fprintf(w, "%s\terror: %s\n", r.Table, termSafe(r.Error))
				continue
			}
			relay := termSafe(r.ActiveRelay)
			if relay == "" {
				relay = "none"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\t%d\t%s\n", r.Table, r.Unpublished,
				(time.Duration(r.OldestAgeSeconds * float64(time.Second))).Round(time.Millisecond), r.Failing, r.Dead, r.HeldAggregates, relay)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("status of %d of %d tables failed", failed, len(rows))
	}
	return nil
}

// status reads table t's status.
func (m *manyTables) status(ctx context.Context, t outboxdriver.Table) (*outboxdriver.Status, error) {
	store, _, err := m.driver(t)
	if err != nil {
		return nil, err
	}
	return store.Status(ctx)
}

func patternsString(ps []outboxdriver.TablePattern) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
