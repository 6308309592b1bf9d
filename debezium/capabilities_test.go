package debezium_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/relay"
)

// TestRelayRefusesColumnsTheStoreLacks: a router that places extra columns
// (table.fields.additional.placement) on a store that cannot read them (SQLite) is
// refused by relay.New, in one error that names the columns and wraps
// ErrNotSupported, instead of failing per event.
func TestRelayRefusesColumnsTheStoreLacks(t *testing.T) {
	t.Parallel()
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := outboxsqlite.New(db, nil).Store()
	if err != nil {
		t.Fatal(err)
	}
	router, err := debezium.New(&debezium.Config{Options: map[string]string{"table.fields.additional.placement": "tenant:header"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = relay.New(store, memory.New(0), &relay.Config{Router: router})
	if !errors.Is(err, outboxdriver.ErrNotSupported) || !strings.Contains(err.Error(), "custom columns [tenant]") {
		t.Errorf("relay.New on SQLite: %v; want ErrNotSupported naming custom columns [tenant]", err)
	}
}
