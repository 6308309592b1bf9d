package simpg_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/simpg"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance: the model passes the driver suite the PostgreSQL driver passes,
// with the same harness settings (several claims at once, concurrent writers, other
// sessions' row locks of every strength).
func TestConformance(t *testing.T) {
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*simpg.Tx] {
		t.Helper()
		db := simpg.NewDB()
		app := db.Client()
		t.Cleanup(app.Close)
		table := outboxdriver.Table{Name: "outbox", Payload: payload}
		drv := simpg.New(app, &table)
		return &outboxdrivertest.Harness[*simpg.Tx]{
			Driver:      drv,
			Begin:       app.Begin,
			Commit:      func(ctx context.Context, tx *simpg.Tx) error { return tx.Commit(ctx) },
			Rollback:    func(ctx context.Context, tx *simpg.Tx) error { return tx.Rollback(ctx) },
			InsertPlain: drv.InsertPlain,
			AddColumn: func(_ context.Context, name, typ string) error {
				return db.AddColumn(table, name, typ)
			},
			Reopen: func(t outboxdriver.Table) outboxdriver.Driver[*simpg.Tx] { return simpg.New(app, &t) },
			HoldRow: func(ctx context.Context, id string, lock outboxdrivertest.RowLock) (func(), error) {
				other := db.Client()
				mode := map[outboxdrivertest.RowLock]simpg.LockMode{
					outboxdrivertest.LockForUpdate: simpg.ForUpdate,
					outboxdrivertest.LockForShare:  simpg.ForShare,
					outboxdrivertest.LockUpdate:    simpg.ForNoKeyUpdate,
				}[lock]
				release, err := other.HoldRow(ctx, table, id, mode, lock == outboxdrivertest.LockUpdate)
				if err != nil {
					other.Close()
					return nil, err
				}
				return func() { release(); other.Close() }, nil
			},
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}
