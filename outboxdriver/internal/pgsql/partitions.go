package pgsql

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PartitionsAhead is how many days of partitions exist ahead of today.
const PartitionsAhead = 3

const partitionDay = "20060102"

func (s *Statements) partitionName(day time.Time) string {
	return s.partitionPrefix() + day.UTC().Format(partitionDay)
}

// partitionPrefix is what every daily partition's name starts with (a derived name,
// so a long table name is cut and hashed the same way for every day).
func (s *Statements) partitionPrefix() string {
	n := s.table.Derived("_p" + partitionDay)
	return n[:len(n)-len(partitionDay)]
}

// partitionDDL returns the statements creating the daily partitions from now's day
// to PartitionsAhead days later, if they do not exist.
func (s *Statements) partitionDDL(now time.Time) []string {
	day := now.UTC().Truncate(24 * time.Hour)
	var out []string
	for i := 0; i <= PartitionsAhead; i++ {
		from := day.AddDate(0, 0, i)
		to := from.AddDate(0, 0, 1)
		out = append(out, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{s.table.Schema, s.partitionName(from)}.Sanitize()+
			" PARTITION OF "+s.qualified+" FOR VALUES FROM ('"+from.Format(time.RFC3339)+"') TO ('"+to.Format(time.RFC3339)+"')")
	}
	return out
}

// ensurePartitions creates the coming days' partitions. A day whose rows already sit
// in the default partition cannot get its own (PostgreSQL refuses, 23514); it is
// skipped, and its rows are cleaned up row by row.
func (s *Statements) ensurePartitions(ctx context.Context, q Querier, now time.Time) error {
	for _, stmt := range s.partitionDDL(now) {
		if err := q.Exec(ctx, stmt); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23514" {
				continue
			}
			return InterpretError(err)
		}
	}
	return nil
}

// dropPublishedPartitions detaches and drops the daily partitions that end before
// `before` and hold no unpublished row, and returns how many rows went with them.
func (s *Store) dropPublishedPartitions(ctx context.Context, before time.Time) (int64, error) {
	rows, err := s.DB.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, s.Statements.qualified)
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
	prefix := s.Statements.partitionPrefix()
	var dropped int64
	for _, n := range names {
		day, err := time.Parse(partitionDay, strings.TrimPrefix(n, prefix))
		if !strings.HasPrefix(n, prefix) || err != nil || !day.AddDate(0, 0, 1).Before(before) && !day.AddDate(0, 0, 1).Equal(before) {
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
			err = QueryRow(ctx, tx, "SELECT EXISTS (SELECT 1 FROM "+part+" WHERE published_at IS NULL), (SELECT count(*) FROM "+part+")",
				nil, &unpublished, &count)
		}
		if err == nil && !unpublished {
			err = tx.Exec(ctx, "ALTER TABLE "+s.Statements.qualified+" DETACH PARTITION "+part)
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
