package testenv

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
)

// HoldRow returns a func that holds the row of event id of table (quoted) from a
// session of db's own, until its release func is called: as an operator, a migration
// or another tool would (outboxdrivertest.Harness.HoldRow). share is the database's
// shared-lock clause; the placeholder is "$1" on PostgreSQL, "?" on MySQL.
func HoldRow(db *sql.DB, table, share, placeholder string) func(ctx context.Context, id string, lock outboxdrivertest.RowLock) (func(), error) {
	return func(ctx context.Context, id string, lock outboxdrivertest.RowLock) (func(), error) {
		stmt := map[outboxdrivertest.RowLock]string{
			outboxdrivertest.LockForUpdate: "SELECT * FROM %s WHERE id = %s FOR UPDATE",
			outboxdrivertest.LockForShare:  "SELECT * FROM %s WHERE id = %s " + share,
			outboxdrivertest.LockUpdate:    "UPDATE %s SET attempts = attempts WHERE id = %s",
		}[lock]
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err == nil {
			var rows *sql.Rows // a query, read to the end: MySQL's Exec of a SELECT * waits
			if rows, err = tx.QueryContext(ctx, fmt.Sprintf(stmt, table, placeholder), id); err == nil {
				for rows.Next() {
				}
				rows.Close()
				err = rows.Err()
			}
		}
		if err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("holding row %s: %w", id, err)
		}
		return func() {
			_ = tx.Rollback()
			_ = conn.Close()
		}, nil
	}
}
