package relay_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

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
