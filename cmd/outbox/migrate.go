package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	payload := fs.String("payload-type", string(outboxdriver.PayloadJSON), "payload column type: json (jsonb) or bytes (bytea)")
	print := fs.Bool("print", false, "print the SQL instead of running it")
	partitioned := fs.Bool("partitioned", false, "PostgreSQL: partition the new table by day on created_at; cleanup then drops whole published days")
	partitions := fs.Int("partitions", outboxdriver.PartitionsDefault, "PostgreSQL: how many partitions rows are hashed into by aggregate (fixed once migrated)")
	cdc := fs.Bool("cdc", false, "PostgreSQL: also create the CDC relay's publication and replication slot, so events are captured from now on (required before producers use the insert-delete or table-less write modes)")
	dropCDC := fs.Bool("drop-cdc", false, "PostgreSQL: retire the table's CDC relay: drop its replication slot (which keeps WAL until dropped), its publication and its record, once every CDC relay of the table is stopped (docs/operations.md)")
	slot := fs.String("slot", "", "with --cdc or --drop-cdc: the replication slot (default outbox_<schema>_<table>; with --tables "+pgcdc.SharedSlotDefault+", one for every table)")
	publication := fs.String("publication", "", "with --cdc or --drop-cdc: the publication (default: the slot's name)")
	tablesList := fs.String("tables", "", tablesFlagHelp+"; a name is created if missing, a pattern upgrades the outbox tables it matches")
	fs.String("trust-owner", "", trustOwnerHelp)
	if err := parse(fs, args); err != nil {
		return err
	}
	if flagSet(fs, "tables") {
		switch {
		case *cdc && *dropCDC:
			return usageErr("--cdc sets up a CDC relay and --drop-cdc retires one: give one of them")
		case *print:
			return usageErr("--print shows one table's SQL: use --table")
		case (*slot != "" || *publication != "") && !*cdc && !*dropCDC:
			return usageErr("--slot and --publication go with --cdc or --drop-cdc")
		}
		many, err := openTables(ctx, fs, *dsn, *tablesList)
		if err != nil {
			return err
		}
		defer many.close()
		if (*cdc || *dropCDC) && many.pg == nil {
			return usageErr("--cdc and --drop-cdc need PostgreSQL (--db postgres://...)")
		}
		if !*dropCDC {
			err := migrateTables(ctx, many, func(t *outboxdriver.Table) {
				t.Payload, t.Partitioned, t.Partitions = outboxdriver.PayloadType(*payload), *partitioned, *partitions
			}, stdout)
			if err != nil || !*cdc {
				return err
			}
		}
		return sharedCDC(ctx, many, *slot, *publication, *dropCDC, stdout)
	}
	table, err := parseTable(*tableName, *payload)
	if err != nil {
		return err
	}
	switch {
	case (*slot != "" || *publication != "") && !*cdc && !*dropCDC:
		return usageErr("--slot and --publication go with --cdc or --drop-cdc")
	case *cdc && *dropCDC:
		return usageErr("--cdc sets up a CDC relay and --drop-cdc retires one: give one of them")
	case *dropCDC && *print:
		return usageErr("--print shows the migrations' SQL; --drop-cdc drops a slot: give one of them")
	case *cdc && *print:
		return usageErr("--print cannot show --cdc's setup: the slot is made over a replication connection; run `outbox migrate --cdc` (or let the CDC relay make them)")
	case *slot != "" && !slotName.MatchString(*slot):
		return usageErr("--slot %q: a replication slot name is 1 to 63 lower-case letters, digits and underscores", *slot)
	case *publication != "" && !slotName.MatchString(*publication):
		return usageErr("--publication %q: 1 to 63 lower-case letters, digits and underscores", *publication)
	}
	table.Partitioned = *partitioned
	table.Partitions = *partitions
	if err := table.Validate(); err != nil {
		return usageErr("--partitions: %v", err)
	}
	if *print && !strings.HasPrefix(*dsn, "sqlite:") && !strings.HasPrefix(*dsn, "mysql:") {
		m, err := outboxpgx.New(nil, &table).Migrator()
		if err != nil {
			return err
		}
		sql, err := m.SQL()
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, sql)
		return err
	}
	db, err := openDB(ctx, *dsn, table, dbOptions{})
	if err != nil {
		return err
	}
	defer db.close()
	if *print {
		sql, err := db.migrator.SQL()
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, sql)
		return err
	}
	if *dropCDC {
		return retireCDC(ctx, db, table, &pgcdc.Config{Slot: *slot, Publication: *publication, Logger: slog.New(slog.DiscardHandler)}, stdout)
	}
	if err := migrateOne(ctx, db.migrator, table, stdout); err != nil {
		return err
	}
	if !*cdc {
		return nil
	}
	if db.cdc == nil {
		return usageErr("--cdc needs PostgreSQL (--db postgres://...)")
	}
	src, err := db.cdc(&pgcdc.Config{Slot: *slot, Publication: *publication, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return usageErr("%v", err)
	}
	if err := src.Init(ctx); err != nil {
		return fmt.Errorf("cdc setup for %s: %w", table, err)
	}
	fmt.Fprintf(stdout, "%s: replication slot %s ready\n", table, src.Slot())
	return nil
}

// sharedCDC is `migrate --tables --cdc` (or --drop-cdc): the one slot and
// publication of `relay --tables --mode cdc`, for every table --tables matches.
func sharedCDC(ctx context.Context, many *manyTables, slot, publication string, drop bool, stdout io.Writer) error {
	sh, err := pgcdc.NewShared(many.pg, &pgcdc.SharedConfig{Slot: slot, Publication: publication, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return usageErr("%v", err)
	}
	tables, err := many.find(ctx, false)
	if err != nil {
		return err
	}
	for _, t := range tables {
		store, _, err := many.driver(t)
		if err == nil {
			_, err = sh.Add(ctx, store, t)
		}
		if err != nil {
			return fmt.Errorf("cdc setup for %s: %w", t, err)
		}
	}
	if !drop {
		if err := sh.Init(ctx); err != nil {
			return fmt.Errorf("cdc setup: %w", err)
		}
		fmt.Fprintf(stdout, "replication slot %s ready for %d tables (publication %s)\n", sh.Slot(), len(tables), sh.Publication())
		return nil
	}
	r, err := sh.Retire(ctx)
	if err != nil {
		return fmt.Errorf("retire the CDC relay of slot %s: %w", sh.Slot(), err)
	}
	fmt.Fprintf(stdout, "%d tables: dropped %s; a polling relay sends only the rows not yet published\n", len(tables),
		droppedText(r, sh.Slot(), sh.Publication()))
	return nil
}

// droppedText says what a retirement dropped.
func droppedText(r pgcdc.Retired, slot, publication string) string {
	var dropped []string
	if r.Slot {
		dropped = append(dropped, "replication slot "+slot)
	}
	if r.Publication {
		dropped = append(dropped, "publication "+publication)
	}
	if len(dropped) == 0 {
		dropped = append(dropped, "nothing (no slot "+slot+", no publication "+publication+")")
	}
	return strings.Join(dropped, " and ")
}

// retireCDC is `migrate --drop-cdc`: the table's slot, publication and slot record
// dropped, once no relay streams from the slot.
func retireCDC(ctx context.Context, db *database, table outboxdriver.Table, cfg *pgcdc.Config, stdout io.Writer) error {
	if db.cdc == nil {
		return usageErr("--drop-cdc needs PostgreSQL (--db postgres://...)")
	}
	src, err := db.cdc(cfg)
	if err != nil {
		return usageErr("%v", err)
	}
	r, err := src.Retire(ctx)
	if err != nil {
		return fmt.Errorf("retire the CDC relay of %s: %w", table, err)
	}
	fmt.Fprintf(stdout, "%s: dropped %s; a polling relay sends only the rows not yet published\n", table, droppedText(r, src.Slot(), src.Publication()))
	return nil
}

// migrateOne applies m's migrations to table and says what it did.
func migrateOne(ctx context.Context, m outboxdriver.Migrator, table outboxdriver.Table, stdout io.Writer) error {
	applied, err := m.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", table, err)
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "%s is up to date\n", table)
	} else {
		fmt.Fprintf(stdout, "%s: applied migrations %v\n", table, applied)
	}
	return nil
}

// migrateTables migrates every table --tables names, each with the table flags
// (set), going on past a table that fails and naming the failed ones at the end.
func migrateTables(ctx context.Context, many *manyTables, set func(*outboxdriver.Table), stdout io.Writer) error {
	tables, err := many.find(ctx, true)
	if err != nil {
		return err
	}
	if len(tables) == 0 && len(many.refused) > 0 {
		return fmt.Errorf("every matched table was refused (owned by others; see above)")
	}
	if len(tables) == 0 {
		return usageErr("--tables %s: no outbox table matches (name a table to create it)", patternsString(many.patterns))
	}
	var failed []string
	for _, t := range tables {
		set(&t)
		err := t.Validate()
		if err != nil {
			err = fmt.Errorf("%s: %w", t, err)
		} else {
			var m outboxdriver.Migrator
			if _, m, err = many.driver(t); err == nil {
				err = migrateOne(ctx, m, t, stdout)
			}
		}
		if err != nil {
			fmt.Fprintln(stdout, err)
			failed = append(failed, t.String())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("migrating %d of %d tables failed: %s", len(failed), len(tables), strings.Join(failed, ", "))
	}
	if len(many.refused) > 0 {
		return fmt.Errorf("%d matched tables refused (owned by others; see above): the others are migrated", len(many.refused))
	}
	return nil
}

// slotName is what PostgreSQL accepts as a replication slot's name (and what the
// relay accepts as a publication's: it names both the same by default).
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
