// Package pgsql holds the PostgreSQL statements, migrations and relay store shared by
// the pgx and database/sql drivers. Each driver adapts its client to the small
// interfaces below, so every query lives in exactly one place.
package pgsql

import (
	"context"
	"time"
)

// Querier runs statements.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) error
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows iterates a result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Tx is a transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Conn is one dedicated session (for advisory locks).
type Conn interface {
	Querier
	Close() error
}

// SharedConn is a Conn on a session that several leaderships share (one session
// holding many tables' locks). A session never conflicts with its own advisory
// locks, and stays alive while any of its leaderships proves itself, so the handles
// keep their own account: Reserve takes key for this handle (exclusive: no other
// handle holds it; shared: no handle holds it exclusively) and reports whether it
// could; a handle holding key exclusively that makes no call for timeout (when
// positive) loses it, as a silent session would; Close gives it back.
type SharedConn interface {
	Conn
	Reserve(key int64, exclusive bool, timeout time.Duration) bool
}

// DB is a pool.
type DB interface {
	Begin(ctx context.Context) (Tx, error)
	Conn(ctx context.Context) (Conn, error)
	Querier
}

// QueryRow runs a query expected to return one row and scans it.
func QueryRow(ctx context.Context, q Querier, sql string, args []any, dest ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return errNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}
