// Package inboxtest is the shared scenario of the broker inbox helpers' tests: a
// SQLite-backed inbox whose handler records every application of an event and fails
// the first delivery of one chosen event. Adapters outside this repository can run it
// too.
package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// Env is an inbox and a handler to consume with.
type Env struct {
	IB       *inbox.Inbox[*sql.Tx]
	db       *sql.DB
	failOnce string
	mu       sync.Mutex
	failed   bool
}

// New returns an Env whose handler fails the first delivery of failOnce.
func New(t *testing.T, failOnce string) *Env {
	t.Helper()
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "consumer.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec(`CREATE TABLE applied (event_id TEXT NOT NULL, aggregateid TEXT NOT NULL, seq INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.NewSQL(db, inbox.SQLite, &inbox.Config{VersionGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &Env{IB: ib, db: db, failOnce: failOnce}
}

// Handler applies an event, failing failOnce's first delivery.
func (e *Env) Handler(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO applied VALUES (?, ?, ?)`, m.ID, m.AggregateID, m.Seq); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if m.ID == e.failOnce && !e.failed {
		e.failed = true
		return errors.New("handler failed on purpose")
	}
	return nil
}

// Wait waits until every id was applied, then checks each was applied exactly once
// and that the failing event did fail once.
func (e *Env) Wait(t *testing.T, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var counts map[string]int
	testenv.WaitTell(t, ctx, "every event applied", func() bool {
		counts = map[string]int{}
		rows, err := e.db.QueryContext(ctx, `SELECT event_id, count(*) FROM applied GROUP BY event_id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var n int
			_ = rows.Scan(&id, &n)
			counts[id] = n
		}
		rows.Close()
		for _, id := range ids {
			if counts[id] == 0 {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("applied %v, want %v", counts, ids) })
	for id, n := range counts {
		if n != 1 {
			t.Fatalf("event %s applied %d times", id, n)
		}
	}
	if len(counts) != len(ids) {
		t.Fatalf("applied %v, want exactly %v", counts, ids)
	}
	e.mu.Lock()
	failed := e.failed
	e.mu.Unlock()
	if e.failOnce != "" && !failed {
		t.Fatal("the failing event never failed")
	}
}

// LogCounter is a logger that counts its records by message.
type LogCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

// NewLogCounter returns a LogCounter and the logger that feeds it.
func NewLogCounter() (*LogCounter, *slog.Logger) {
	c := &LogCounter{counts: map[string]int{}}
	return c, slog.New(c)
}

// Count is how many records had msg.
func (c *LogCounter) Count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[msg]
}

func (c *LogCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *LogCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[r.Message]++
	return nil
}
func (c *LogCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *LogCounter) WithGroup(string) slog.Handler      { return c }
