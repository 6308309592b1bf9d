package pgsql

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// PartitionsAhead is how many days of partitions exist ahead of today.
const PartitionsAhead = 3

const partitionDay = "20060102"

// dailyPartitions is a table partitioned by day: the outbox (by created_at) or, on a
// partitioned outbox, its archive of published rows (by published_at).
type dailyPartitions struct {
	parent string // quoted
	prefix string // what every day's partition name starts with
	// unpublishedRows: a day may hold unpublished rows, and is dropped only when it
	// holds none (the outbox; every archived row is published).
	unpublishedRows bool
}

// daily returns the table's partitioned tables: the outbox, and its archive.
func (s *Statements) daily() []dailyPartitions {
	return []dailyPartitions{
		{parent: s.qualified, prefix: s.dayPrefix("_p"), unpublishedRows: true},
		{parent: s.published, prefix: s.dayPrefix("_published_p")},
	}
}

// dayPrefix is what every daily partition's name starts with (a derived name, so a
// long table name is cut and hashed the same way for every day).
func (s *Statements) dayPrefix(suffix string) string {
	n := s.table.Derived(suffix + partitionDay)
	return n[:len(n)-len(partitionDay)]
}

// partitionDDL returns the statements creating the daily partitions of the outbox and
// its archive from now's day to PartitionsAhead days later, if they do not exist.
func (s *Statements) partitionDDL(now time.Time) []string {
	day := now.UTC().Truncate(24 * time.Hour)
	var out []string
	for _, d := range s.daily() {
		for i := 0; i <= PartitionsAhead; i++ {
			from := day.AddDate(0, 0, i)
			to := from.AddDate(0, 0, 1)
			// A day whose rows already sit in the default partition cannot get its own
			// (check_violation): it is skipped, inside a block of its own, so a
			// migration's transaction goes on; its rows are cleaned up row by row.
			out = append(out, "DO $$ BEGIN CREATE TABLE IF NOT EXISTS "+pgx.Identifier{s.table.Schema, d.prefix + from.Format(partitionDay)}.Sanitize()+
				" PARTITION OF "+d.parent+" FOR VALUES FROM ('"+from.Format(time.RFC3339)+"') TO ('"+to.Format(time.RFC3339)+"');"+
				" EXCEPTION WHEN check_violation THEN NULL; END $$")
		}
	}
	return out
}

// ensurePartitions creates the coming days' partitions (partitionDDL says which are
// skipped).
func (s *Statements) ensurePartitions(ctx context.Context, q Querier, now time.Time) error {
	for _, stmt := range s.partitionDDL(now) {
		if err := q.Exec(ctx, stmt); err != nil {
			return InterpretError(err)
		}
	}
	return nil
}

// dropPublishedPartitions detaches and drops the daily partitions of the outbox and
// its archive that end before `before` and hold no unpublished row, and returns how
// many rows went with them.
func (s *Store) dropPublishedPartitions(ctx context.Context, before time.Time) (int64, error) {
	var dropped int64
	for _, d := range s.Statements.daily() {
		n, err := s.dropDays(ctx, d, before)
		dropped += n
		if err != nil {
			return dropped, err
		}
	}
	return dropped, nil
}

func (s *Store) dropDays(ctx context.Context, d dailyPartitions, before time.Time) (int64, error) {
	rows, err := s.DB.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, d.parent)
	if err != nil {
		return 0, InterpretError(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return 0, err
		}
		names = append(names, n)
	}
	rows.Close()
	var dropped int64
	for _, n := range names {
		day, err := time.Parse(partitionDay, strings.TrimPrefix(n, d.prefix))
		if !strings.HasPrefix(n, d.prefix) || err != nil || !day.AddDate(0, 0, 1).Before(before) && !day.AddDate(0, 0, 1).Equal(before) {
			continue
		}
		part := pgx.Identifier{s.Statements.table.Schema, n}.Sanitize()
		tx, err := s.DB.Begin(ctx)
		if err != nil {
			return dropped, InterpretError(err)
		}
		// Lock the partition, then check: a day with an unpublished row is never dropped.
		var unpublished bool
		var count int64
		err = tx.Exec(ctx, "LOCK TABLE "+part+" IN ACCESS EXCLUSIVE MODE")
		if err == nil {
			unpublishedSQL := "false"
			if d.unpublishedRows {
				unpublishedSQL = "EXISTS (SELECT 1 FROM " + part + " WHERE published_at IS NULL)"
			}
			err = QueryRow(ctx, tx, "SELECT "+unpublishedSQL+", (SELECT count(*) FROM "+part+")", nil, &unpublished, &count)
		}
		if err == nil && !unpublished {
			err = tx.Exec(ctx, "ALTER TABLE "+d.parent+" DETACH PARTITION "+part)
			if err == nil {
				err = tx.Exec(ctx, "DROP TABLE "+part)
			}
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return dropped, InterpretError(err)
		}
		if err := tx.Commit(ctx); err != nil {
			return dropped, InterpretError(err)
		}
		if !unpublished {
			dropped += count
		}
	}
	return dropped, nil
}
