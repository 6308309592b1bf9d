package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("cleanup", stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	olderThan := fs.Duration("older-than", relay.RetentionDefault, "delete rows published longer ago than this")
	batch := fs.Int("batch", relay.CleanupBatchDefault, "rows per delete statement")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *olderThan <= 0 || *batch <= 0 {
		return usageErr("--older-than and --batch must be positive")
	}
	db, table, err := openTable(ctx, *dsn, *tableName)
	if err != nil {
		return err
	}
	defer db.close()
	before := time.Now().Add(-*olderThan)
	var total int64
	for {
		n, err := db.store.Cleanup(ctx, &outboxdriver.CleanupParams{Before: before, Limit: *batch})
		if err != nil {
			return fmt.Errorf("cleanup of %s: %w", table, err)
		}
		total += n
		if n < int64(*batch) {
			break
		}
	}
	fmt.Fprintf(stdout, "deleted %d published rows older than %s from %s (unpublished rows are never deleted)\n", total, *olderThan, table)
	return nil
}
