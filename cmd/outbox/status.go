package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", stderr)
	dsn := fs.String("db", "", "database URL: postgres://user@host:5432/db or sqlite://PATH")
	tableName := fs.String("table", outboxdriver.DefaultSchema+"."+outboxdriver.DefaultTable, "outbox table, [schema.]name")
	asJSON := fs.Bool("json", false, "print JSON, for scripts")
	if err := parse(fs, args); err != nil {
		return err
	}
	db, table, err := openTable(ctx, *dsn, *tableName)
	if err != nil {
		return err
	}
	defer db.close()
	st, err := db.store.Status(ctx)
	if err != nil {
		return fmt.Errorf("status of %s: %w", table, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Table              string  `json:"table"`
			Unpublished        int64   `json:"unpublished"`
			OldestAgeSeconds   float64 `json:"oldest_unpublished_age_seconds"`
			PublishedKept      int64   `json:"published_kept"`
			FailingUnpublished int64   `json:"failing"`
		}{st.Table, st.Unpublished, st.OldestAge.Seconds(), st.Published, st.Failing})
	}
	fmt.Fprintf(stdout, "table:                 %s\n", st.Table)
	fmt.Fprintf(stdout, "unpublished:           %d\n", st.Unpublished)
	fmt.Fprintf(stdout, "oldest unpublished:    %s\n", st.OldestAge.Round(time.Millisecond))
	fmt.Fprintf(stdout, "failing (attempts>0):  %d\n", st.Failing)
	fmt.Fprintf(stdout, "published, kept:       %d\n", st.Published)
	fmt.Fprintf(stdout, "dead letters:          %d (holding %d aggregates; see `outbox dlq list`)\n", st.Dead, st.HeldKeys)
	switch {
	case st.ActiveRelay == "":
		fmt.Fprintf(stdout, "active relay:          none\n")
	case st.ActiveSince.IsZero():
		fmt.Fprintf(stdout, "active relay:          %s\n", st.ActiveRelay)
	default:
		fmt.Fprintf(stdout, "active relay:          %s, since %s\n", st.ActiveRelay, st.ActiveSince.UTC().Format(time.RFC3339))
	}
	return nil
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
