package simpg

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// The server's behaviours the driver suite does not reach, on the bubble's virtual
// clock: what the simulation relies on beyond the store's contract.

// TestAdvisoryQueue: a shared request waits behind a queued exclusive one, as
// PostgreSQL queues them, so a stream of claims cannot starve a new leader's wait for
// the claim fence.
func TestAdvisoryQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := NewDB()
		c := db.Client()
		defer c.Close()
		ctx := context.Background()
		const key = 42
		hold, waiter, late := begin(t, c), begin(t, c), begin(t, c)
		lock := func(tx *Tx, exclusive bool) {
			db.mu.Lock()
			defer db.mu.Unlock()
			if err := tx.advisoryXact(ctx, key, exclusive); err != nil {
				t.Error(err)
			}
		}
		lock(hold, false)
		gotExclusive, gotShared := make(chan struct{}), make(chan struct{})
		go func() { lock(waiter, true); close(gotExclusive) }()
		synctest.Wait()
		go func() { lock(late, false); close(gotShared) }()
		synctest.Wait()
		select {
		case <-gotShared:
			t.Fatal("a shared request passed an exclusive one queued before it")
		default:
		}
		hold.rollback()
		<-gotExclusive
		synctest.Wait()
		select {
		case <-gotShared:
			t.Fatal("a shared request was granted beside an exclusive holder")
		default:
		}
		waiter.rollback()
		<-gotShared
		late.rollback()
	})
}

// TestServerTimeouts: a transaction idle past its idle_in_transaction_session_timeout
// and a session idle past its idle_session_timeout are ended by the server's clock,
// their locks with them; a wait gives up at lock_timeout.
func TestServerTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := NewDB()
		c := db.Client()
		defer c.Close()
		ctx := context.Background()
		r := &row{committed: &rec{}}

		idle := begin(t, c)
		idle.idleTimeout = time.Second
		db.mu.Lock()
		if ok, err := idle.lock(ctx, r, ForUpdate, false); !ok || err != nil {
			t.Fatalf("lock: %v %v", ok, err)
		}
		db.mu.Unlock()
		waiter := begin(t, c)
		waiter.lockTimeout = 5 * time.Second
		start := time.Now()
		db.mu.Lock()
		ok, err := waiter.lock(ctx, r, ForShare, false)
		db.mu.Unlock()
		if !ok || err != nil || time.Since(start) != time.Second {
			t.Fatalf("the waiter got the lock after %v (%v, %v); want at the holder's idle timeout, 1s", time.Since(start), ok, err)
		}
		db.mu.Lock()
		err = idle.stmt(ctx)
		db.mu.Unlock()
		if !errors.Is(err, ErrSessionEnded) {
			t.Fatalf("a statement of the ended transaction: %v", err)
		}

		timed := begin(t, c)
		timed.lockTimeout = 2 * time.Second
		db.mu.Lock()
		ok, err = timed.lock(ctx, r, ForUpdate, false) // the waiter holds it FOR SHARE
		db.mu.Unlock()
		if ok || !errors.Is(err, ErrLockTimeout) {
			t.Fatalf("a wait past lock_timeout: %v, %v", ok, err)
		}
		waiter.rollback()
		timed.rollback()

		table := outboxdriver.Table{Name: "outbox"}
		m, _ := New(c, &table).Migrator()
		if _, err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		s, _ := New(c, &table).Store()
		lead, err := s.AcquireLeadership(ctx, &outboxdriver.LeadershipParams{Timeout: time.Second})
		if err != nil || lead == nil {
			t.Fatalf("acquire: %v, %v", lead, err)
		}
		time.Sleep(900 * time.Millisecond) //nolint:forbidigo // the bubble's virtual clock: within the leader's timeout, no real time passes
		if err := lead.Check(ctx); err != nil {
			t.Fatalf("a check within the timeout: %v", err)
		}
		if other, err := s.AcquireLeadership(ctx, nil); other != nil || err != nil {
			t.Fatalf("a second leader while the first is alive: %v, %v", other, err)
		}
		time.Sleep(time.Second) //nolint:forbidigo // the bubble's virtual clock: past the silent leader's timeout, no real time passes
		other, err := s.AcquireLeadership(ctx, nil)
		if other == nil || err != nil {
			t.Fatalf("no leadership after the silent leader's timeout: %v, %v", other, err)
		}
		if err := lead.Check(ctx); !errors.Is(err, outboxdriver.ErrLeadershipLost) {
			t.Fatalf("the silent leader's check: %v, want ErrLeadershipLost", err)
		}
		_ = other.Release(ctx)
	})
}

func begin(t *testing.T, c *Client) *Tx {
	t.Helper()
	tx, err := c.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tx
}
