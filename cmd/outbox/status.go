package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/outboxd/outbox/internal/human"
	"github.com/outboxd/outbox/outboxdriver"
)

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	tablesList := fs.String("tables", "", tablesFlagHelp+"; prints one line per table")
	fs.String("trust-owner", "", trustOwnerHelp)
	asJSON := fs.Bool("json", false, "print JSON, for scripts")
	if err := parse(fs, args); err != nil {
		return err
	}
	if flagSet(fs, "tables") {
		many, err := openTables(ctx, fs, *dsn, *tablesList)
		if err != nil {
			return err
		}
		defer many.close()
		return tablesOverview(ctx, many, *asJSON, stdout)
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
	schema, err := db.migrator.Schema(ctx)
	if err != nil {
		schema = nil // said below: a role may see the table but not its migrations
	}
	if *asJSON {
		return printStatusJSON(stdout, st, schema, err)
	}
	printStatus(stdout, st, schema, err)
	return nil
}

// printStatusJSON prints a table's status for scripts (schema is nil when it could
// not be read: err says why).
func printStatusJSON(stdout io.Writer, st *outboxdriver.Status, schema *outboxdriver.SchemaState, err error) error {
	type slot struct {
		Name          string `json:"name"`
		Exists        bool   `json:"exists"`
		Active        bool   `json:"active"`
		WALStatus     string `json:"wal_status"`
		RetainedBytes int64  `json:"retained_wal_bytes"`
		LagBytes      int64  `json:"lag_bytes"`
		SafeBytes     int64  `json:"safe_wal_bytes"`
		Backfilled    bool   `json:"backfilled"`
	}
	slots := []slot{}
	for _, s := range st.Slots {
		slots = append(slots, slot(s))
	}
	type relayJSON struct {
		ID                  string  `json:"id"`
		Info                string  `json:"info"`
		HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
		Partitions          []int   `json:"partitions"`
		OldestLeaseSeconds  float64 `json:"oldest_lease_seconds"`
	}
	relays := []relayJSON{}
	for _, rs := range st.Relays {
		relays = append(relays, relayJSON{rs.ID, rs.Info, rs.HeartbeatAge.Seconds(), rs.Partitions, rs.OldestLease.Seconds()})
	}
	return printJSON(stdout, struct {
		Table              string      `json:"table"`
		Unpublished        int64       `json:"unpublished"`
		OldestAgeSeconds   float64     `json:"oldest_unpublished_age_seconds"`
		PublishedKept      int64       `json:"published_kept"`
		FailingUnpublished int64       `json:"failing"`
		Dead               int64       `json:"dead_letters"`
		HeldAggregates     int64       `json:"held_aggregates"`
		ActiveRelay        string      `json:"active_relay"`
		ActiveSince        *time.Time  `json:"active_since"`
		Slots              []slot      `json:"cdc_slots"`
		Relays             []relayJSON `json:"relays"`
		PartitionBacklog   []int64     `json:"partition_backlog"`
		SchemaVersion      int         `json:"schema_version"`
		SchemaKnown        int         `json:"schema_version_known"`
		SchemaError        string      `json:"schema_error,omitempty"`
		HistoryFrom        *time.Time  `json:"history_from"`
	}{st.Table, st.Unpublished, st.OldestAge.Seconds(), st.Published, st.Failing, st.Dead, st.HeldKeys,
		st.ActiveRelay, timeOrNil(st.ActiveSince), slots, relays, st.PartitionBacklog,
		schemaVersion(schema), latest(schema), schemaErr(schema, err), timeOrNil(st.OldestPublished)})
}

// printStatus prints a table's status for people.
func printStatus(stdout io.Writer, st *outboxdriver.Status, schema *outboxdriver.SchemaState, err error) {
	fmt.Fprintf(stdout, "table:                 %s\n", st.Table)
	fmt.Fprintf(stdout, "unpublished:           %d\n", st.Unpublished)
	fmt.Fprintf(stdout, "oldest unpublished:    %s\n", st.OldestAge.Round(time.Millisecond))
	fmt.Fprintf(stdout, "failing (attempts>0):  %d\n", st.Failing)
	fmt.Fprintf(stdout, "published, kept:       %d\n", st.Published)
	if !st.OldestPublished.IsZero() {
		fmt.Fprintf(stdout, "history (replay):      back to %s (%s ago)\n", st.OldestPublished.UTC().Format(time.RFC3339), human.Age(time.Since(st.OldestPublished)))
	}
	fmt.Fprintf(stdout, "dead letters:          %d (holding %d aggregates; see `outbox dlq list`)\n", st.Dead, st.HeldKeys)
	fmt.Fprintf(stdout, "schema:                %s\n", schemaLine(schema, err))
	switch {
	case st.ActiveRelay == "":
		fmt.Fprintf(stdout, "active relay:          none\n")
	case st.ActiveSince.IsZero():
		fmt.Fprintf(stdout, "active relay:          %s\n", termSafe(st.ActiveRelay))
	default:
		fmt.Fprintf(stdout, "active relay:          %s, since %s\n", termSafe(st.ActiveRelay), st.ActiveSince.UTC().Format(time.RFC3339))
	}
	if len(st.Relays) > 0 {
		fmt.Fprintf(stdout, "relays in the group:   %d\n", len(st.Relays))
		for _, rs := range st.Relays {
			var backlog int64
			for _, p := range rs.Partitions {
				if p < len(st.PartitionBacklog) {
					backlog += st.PartitionBacklog[p]
				}
			}
			fmt.Fprintf(stdout, "  %s: heartbeat %s ago, %d partitions %s, held for up to %s, backlog %d\n", termSafe(rs.ID),
				rs.HeartbeatAge.Round(time.Millisecond), len(rs.Partitions), human.Ranges(rs.Partitions), rs.OldestLease.Round(time.Second), backlog)
		}
	}
	for _, sl := range st.Slots {
		state := sl.WALStatus
		switch {
		case !sl.Exists:
			state = "LOST (dropped): recover with `outbox relay --mode cdc --recreate-slot`"
		case sl.WALStatus == "lost":
			state = "LOST (invalidated): recover with `outbox relay --mode cdc --recreate-slot`"
		case sl.Active:
			state += ", streaming"
		default:
			state += ", no relay streaming"
		}
		safe := "unlimited (max_slot_wal_keep_size unset)"
		if sl.SafeBytes >= 0 {
			safe = human.Bytes(sl.SafeBytes)
		}
		fmt.Fprintf(stdout, "cdc slot %s: %s; lag %s, retained WAL %s, safe %s; backfilled %v\n",
			sl.Name, state, human.Bytes(sl.LagBytes), human.Bytes(sl.RetainedBytes), safe, sl.Backfilled)
	}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// schemaLine says a table's schema version against this build's (st is nil when it
// could not be read: err).
func schemaLine(st *outboxdriver.SchemaState, err error) string {
	switch {
	case st == nil:
		return fmt.Sprintf("unknown (%v)", err)
	case !st.Managed:
		return fmt.Sprintf("not managed by outbox migrate (this build knows version %d)", st.Latest)
	case st.Check() != nil:
		return fmt.Sprintf("version %d: %v", st.Version(), st.Check())
	}
	return fmt.Sprintf("version %d (current)", st.Version())
}

func schemaVersion(st *outboxdriver.SchemaState) int {
	if st == nil {
		return 0
	}
	return st.Version()
}

func latest(st *outboxdriver.SchemaState) int {
	if st == nil {
		return 0
	}
	return st.Latest
}

func schemaErr(st *outboxdriver.SchemaState, err error) string {
	if st != nil {
		err = st.Check()
	}
	if err == nil {
		return ""
	}
	return err.Error()
}
