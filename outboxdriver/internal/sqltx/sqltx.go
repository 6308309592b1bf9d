// Package sqltx bounds what database/sql leaves unbounded: a transaction's COMMIT,
// which takes no context.
package sqltx

import (
	"context"
	"database/sql"
	"fmt"
)

// Commit commits tx, or gives up when ctx ends first: a connection that went silent
// (a black hole) must not hold the caller past its deadline. The outcome is then
// unknown: the commit may still land, and the caller treats it as failed (the relay
// publishes the rows again: a duplicate, never a loss). The COMMIT itself goes on in
// the background until the connection answers or dies.
func Commit(ctx context.Context, tx *sql.Tx) error {
	if ctx.Done() == nil {
		return tx.Commit()
	}
	done := make(chan error, 1)
	go func() { done <- tx.Commit() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("commit: no answer before the deadline, outcome unknown: %w", ctx.Err())
	}
}
