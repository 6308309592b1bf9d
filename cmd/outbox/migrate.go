package main

import (
	"context"
	"flag"
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
	o := &migrateOptions{}
	fs := newFlags("migrate", stderr)
	o.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := o.validate(flagSet(fs, "tables")); err != nil {
		return err
	}
	if flagSet(fs, "tables") {
		return o.many(ctx, fs, stdout)
	}
	return o.one(ctx, stdout)
}

// migrateOptions are migrate's flags.
type migrateOptions struct {
	dsn, table                         *string
	payload, slot, publication, tables string
	print, partitioned, cdc, dropCDC   bool
	partitions                         int
}

func (o *migrateOptions) register(fs *flag.FlagSet) {
	o.dsn, o.table = dbTableFlags(fs, dbFlagHelp)
	fs.StringVar(&o.payload, "payload-type", string(outboxdriver.PayloadJSON), "payload column type: json (jsonb) or bytes (bytea)")
	fs.BoolVar(&o.print, "print", false, "print the SQL instead of running it")
	fs.BoolVar(&o.partitioned, "partitioned", false, "PostgreSQL: partition the new table by day on created_at; cleanup then drops whole published days")
	fs.IntVar(&o.partitions, "partitions", outboxdriver.PartitionsDefault, "PostgreSQL: how many partitions rows are hashed into by aggregate (fixed once migrated)")
	fs.BoolVar(&o.cdc, "cdc", false, "PostgreSQL: also create the CDC relay's publication and replication slot, so events are captured from now on (required before producers use the insert-delete or table-less write modes)")
	fs.BoolVar(&o.dropCDC, "drop-cdc", false, "PostgreSQL: retire the table's CDC relay: drop its replication slot (which keeps WAL until dropped), its publication and its record, once every CDC relay of the table is stopped (docs/operations.md)")
	fs.StringVar(&o.slot, "slot", "", "with --cdc or --drop-cdc: the replication slot (default outbox_<schema>_<table>; with --tables "+pgcdc.SharedSlotDefault+", one for every table)")
	fs.StringVar(&o.publication, "publication", "", "with --cdc or --drop-cdc: the publication (default: the slot's name)")
	fs.StringVar(&o.tables, "tables", "", tablesFlagHelp+"; a name is created if missing, a pattern upgrades the outbox tables it matches")
	fs.String("trust-owner", "", trustOwnerHelp)
}

// validate checks the flags that go together (many: --tables was given).
func (o *migrateOptions) validate(many bool) error {
	switch {
	case o.cdc && o.dropCDC:
		return usageErr("--cdc sets up a CDC relay and --drop-cdc retires one: give one of them")
	case (o.slot != "" || o.publication != "") && !o.cdc && !o.dropCDC:
		return usageErr("--slot and --publication go with --cdc or --drop-cdc")
	case many && o.print:
		return usageErr("--print shows one table's SQL: use --table")
	case many:
		return nil
	case o.dropCDC && o.print:
		return usageErr("--print shows the migrations' SQL; --drop-cdc drops a slot: give one of them")
	case o.cdc && o.print:
		return usageErr("--print cannot show --cdc's setup: the slot is made over a replication connection; run `outbox migrate --cdc` (or let the CDC relay make them)")
	case o.slot != "" && !slotName.MatchString(o.slot):
		return usageErr("--slot %q: a replication slot name is 1 to 63 lower-case letters, digits and underscores", o.slot)
	case o.publication != "" && !slotName.MatchString(o.publication):
		return usageErr("--publication %q: 1 to 63 lower-case letters, digits and underscores", o.publication)
	}
	return nil
}

// many migrates every table --tables names (and sets up or retires their shared CDC slot).
func (o *migrateOptions) many(ctx context.Context, fs *flag.FlagSet, stdout io.Writer) error {
	many, err := openTables(ctx, fs, *o.dsn, o.tables)
	if err != nil {
		return err
	}
	defer many.close()
	if (o.cdc || o.dropCDC) && many.pg == nil {
		return usageErr("--cdc and --drop-cdc need PostgreSQL (--db postgres://...)")
	}
	if !o.dropCDC {
		err := migrateTables(ctx, many, func(t *outboxdriver.Table) {
			t.Payload, t.Partitioned, t.Partitions = outboxdriver.PayloadType(o.payload), o.partitioned, o.partitions
		}, stdout)
		if err != nil || !o.cdc {
			return err
		}
	}
	return sharedCDC(ctx, many, o.slot, o.publication, o.dropCDC, stdout)
}

// one migrates one table, prints its SQL, or sets up or retires its CDC relay.
func (o *migrateOptions) one(ctx context.Context, stdout io.Writer) error {
	table, err := parseTable(*o.table, o.payload)
	if err != nil {
		return err
	}
	table.Partitioned = o.partitioned
	table.Partitions = o.partitions
	if err := table.Validate(); err != nil {
		return usageErr("--partitions: %v", err)
	}
	if o.print && !strings.HasPrefix(*o.dsn, "sqlite:") && !strings.HasPrefix(*o.dsn, "mysql:") {
		m, err := outboxpgx.New(nil, &table).Migrator() // PostgreSQL's SQL needs no database
		if err != nil {
			return err
		}
		return printSQL(m, stdout)
	}
	db, err := openDB(ctx, *o.dsn, table, dbOptions{})
	if err != nil {
		return err
	}
	defer db.close()
	cdcConfig := &pgcdc.Config{Slot: o.slot, Publication: o.publication, Logger: slog.New(slog.DiscardHandler)}
	switch {
	case o.print:
		return printSQL(db.migrator, stdout)
	case o.dropCDC:
		return retireCDC(ctx, db, table, cdcConfig, stdout)
	}
	if err := migrateOne(ctx, db.migrator, table, stdout); err != nil || !o.cdc {
		return err
	}
	if db.cdc == nil {
		return usageErr("--cdc needs PostgreSQL (--db postgres://...)")
	}
	src, err := db.cdc(cdcConfig)
	if err != nil {
		return usageErr("%v", err)
	}
	if err := src.Init(ctx); err != nil {
		return fmt.Errorf("cdc setup for %s: %w", table, err)
	}
	fmt.Fprintf(stdout, "%s: replication slot %s ready\n", table, src.Slot())
	return nil
}

// printSQL prints the migrations' SQL.
func printSQL(m outboxdriver.Migrator, stdout io.Writer) error {
	sql, err := m.SQL()
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, sql)
	return err
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
