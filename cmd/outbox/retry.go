package main

import (
	"context"
	"fmt"
	"io"

	"github.com/outboxd/outbox/outboxdriver"
)

// runRetry makes events that wait for a retry due now: once a destination is fixed
// (the stream created, the queue bound), its events need not wait out their backoff
// (up to --retry-max).
func runRetry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("retry", stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	var f outboxdriver.WaitFilter
	fs.StringVar(&f.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&f.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	all := fs.Bool("all", false, "every event waiting for a retry")
	ids, err := parseWithIDs(fs, args)
	if err != nil {
		return err
	}
	f.IDs = ids
	if len(ids) == 0 && f.AggregateType == "" && f.AggregateID == "" && !*all {
		return usageErr("retry needs ids, a filter (--aggregate-type, --aggregate-id) or --all")
	}
	db, _, err := openTable(ctx, *dsn, *tableName)
	if err != nil {
		return err
	}
	defer db.close()
	n, err := db.store.RetryNow(ctx, &f)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d waiting event(s) due now: the relay sends them on its next pass (polling mode; a CDC relay retries from memory on its own schedule)\n", n)
	return nil
}
