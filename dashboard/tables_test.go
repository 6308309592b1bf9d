package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/outboxdriver"
)

// TestTables: one page lists every table, trouble first (the oldest waiting event,
// then the dead letters); each table's own pages sit under /ui/t/<table>/; one
// sign-in acts on every table; a table no longer found goes from the page.
func TestTables(t *testing.T) {
	t.Parallel()
	fs := []*fixture{newFixture(t, dashboard.Config{}), newFixture(t, dashboard.Config{}), newFixture(t, dashboard.Config{})}
	ev := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{}`)}
	fs[1].write(ev, ev)
	dead := fs[2].write(ev)
	fs[2].kill(t, dead...)
	quiet, waiting, dying := fs[0].table.String(), fs[1].table.String(), fs[2].table.String()

	var mu sync.Mutex
	listed := []outboxdriver.Table{fs[0].table, fs[1].table, fs[2].table}
	d, err := dashboard.NewTables(&dashboard.TablesConfig{
		Find: func(context.Context) ([]outboxdriver.Table, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(listed), nil
		},
		Table: func(tb outboxdriver.Table) (*dashboard.Config, error) {
			for _, f := range fs {
				if f.table == tb {
					return &dashboard.Config{Admin: f.store}, nil
				}
			}
			return nil, errors.New("unknown table")
		},
		Token: "s3cret-admin-token",
	})
	if err != nil {
		t.Fatal(err)
	}
	u := serve(t, d).URL + "/ui"
	c := client(t)

	code, page := get(t, c, u+"/")
	if code != http.StatusOK {
		t.Fatalf("the overview: %d %s", code, page)
	}
	at := func(page, table string) int { return strings.Index(page, `data-table="`+table+`"`) }
	if a, b, q := at(page, waiting), at(page, dying), at(page, quiet); a < 0 || b < 0 || q < 0 || !(a < b && b < q) {
		t.Fatalf("the overview lists %s (waiting) at %d, %s (a dead letter) at %d, %s (quiet) at %d; want every one, in that order:\n%s",
			waiting, a, dying, b, quiet, q, page)
	}
	if !strings.Contains(page, `id="tables">3<`) || !strings.Contains(page, `id="backlog">2<`) || !strings.Contains(page, `id="dead">1<`) {
		t.Fatalf("the overview's totals:\n%s", page)
	}
	if _, part := get(t, c, u+"/?partial=1"); strings.Contains(part, "<html") || !strings.Contains(part, `id="table-list"`) {
		t.Fatalf("the overview's live part:\n%s", part)
	}

	// A table's own pages, with a way back.
	tu := func(table string) string { return u + "/t/" + url.PathEscape(table) }
	code, page = get(t, c, tu(waiting)+"/")
	if code != http.StatusOK || !strings.Contains(page, `id="backlog">2<`) || !strings.Contains(page, `id="all-tables"`) ||
		!strings.Contains(page, "<code>"+waiting+"</code>") {
		t.Fatalf("a table's overview: %d\n%s", code, page)
	}

	// One sign-in, on the front page, acts on any table.
	if code, _ := post(t, c, u+"/login", url.Values{"token": {"s3cret-admin-token"}}); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	_, page = get(t, c, tu(dying)+"/dead")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on another table's dead letters after signing in once:\n%s", page)
	}
	if code, _ := post(t, c, tu(dying)+"/dead/action", url.Values{"do": {"replay-selected"}, "id": dead, "csrf": {m[1]}}); code != http.StatusSeeOther {
		t.Fatalf("replay on a table's page: %d", code)
	}
	if st := fs[2].state(t, dead[0]); st != outboxdriver.EventWaiting {
		t.Fatalf("after the replay the event is %s, want waiting", st)
	}

	// What is not a table's page is not found; nor is a table not listed.
	for _, path := range []string{"/relays", "/dead", "/t/nope.outbox/", "/t/"} {
		if code, _ := get(t, c, u+path); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, code)
		}
	}
	mu.Lock()
	listed = listed[:2]
	mu.Unlock()
	if _, page := get(t, c, u+"/"); at(page, dying) >= 0 || !strings.Contains(page, `id="tables">2<`) {
		t.Fatalf("a table no longer found is still listed:\n%s", page)
	}
	if code, _ := get(t, c, tu(dying)+"/"); code != http.StatusNotFound {
		t.Fatalf("the page of a table no longer found: %d", code)
	}

	req, _ := http.NewRequest(http.MethodGet, u+"/", nil)
	req.Host = "evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("another host name: %d", resp.StatusCode)
	}
}
