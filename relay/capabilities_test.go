package relay_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/relay"
)

// TestNewRefusesWhatTheStoreCannotHonour: a configuration the store does not declare
// it honours is refused by relay.New, in one error that names what and wraps
// ErrNotSupported (debezium's tests cover a router's extra columns); it used to be found per event (archive completion on SQLite: every
// Complete failed and one event was published 38 times in 2 s) or only at Run (groups).
func TestNewRefusesWhatTheStoreCannotHonour(t *testing.T) {
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := outboxsqlite.New(db, nil).Store()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  relay.Config
		want string
	}{
		{"archive", relay.Config{Completion: outboxdriver.CompleteArchive}, `completion "archive"`},
		{"group", relay.Config{Group: &relay.GroupConfig{}}, "several active relays"},
	} {
		_, err := relay.New(store, memory.New(0), &tc.cfg)
		if !errors.Is(err, outboxdriver.ErrNotSupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: relay.New on SQLite: %v; want ErrNotSupported naming %s", tc.name, err, tc.want)
		}
	}
	for _, c := range store.Capabilities().Completions {
		if _, err := relay.New(store, memory.New(0), &relay.Config{Completion: c}); err != nil {
			t.Errorf("completion %q, which SQLite declares: %v", c, err)
		}
	}
}

// TestNewRefusesALedgerItCannotRun: a transactional publisher (broker.Ledger) runs on a
// store that marks rows outside a claim, and in a group only with a ledger per
// partition (broker.UnitLedger); relay.New refuses the rest in one error, before
// anything connects.
func TestNewRefusesALedgerItCannotRun(t *testing.T) {
	ledger, err := kafka.DialTransactional("kafka://127.0.0.1:1", &kafka.TxConfig{TransactionalID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	e := setup(t)
	for _, tc := range []struct {
		name  string
		store outboxdriver.Source
		pub   broker.Ledger
		cfg   relay.Config
		want  string
	}{
		// A source that completes rows only through claims (as the CDC source).
		{"no Completer", struct{ outboxdriver.Source }{e.store}, ledger, relay.Config{}, "marks rows outside a claim"},
		// A ledger with no Unit: one producer cannot be fenced per partition.
		{"group", e.store, struct{ broker.Ledger }{ledger}, relay.Config{Group: &relay.GroupConfig{}}, "one ledger per partition"},
	} {
		_, err := relay.New(tc.store, tc.pub, &tc.cfg)
		if !errors.Is(err, outboxdriver.ErrNotSupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: relay.New: %v; want ErrNotSupported naming %s", tc.name, err, tc.want)
		}
	}
	if _, err := relay.New(e.store, ledger, nil); err != nil {
		t.Errorf("a single relay on PostgreSQL: %v", err)
	}
	if _, err := relay.New(e.store, ledger, &relay.Config{Group: &relay.GroupConfig{}}); err != nil {
		t.Errorf("a group member on PostgreSQL with a ledger per partition: %v", err)
	}
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sqlite, _ := outboxsqlite.New(db, nil).Store()
	if _, err := relay.New(sqlite, ledger, nil); err != nil {
		t.Errorf("a single relay on SQLite: %v", err)
	}
}
