package pgsql

import (
	"context"
	"embed"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations renders the embedded migrations for the statements' table.
func (s *Statements) Migrations() ([]migrations.Migration, error) {
	t := s.table
	return migrations.Load(migrationFS, map[string]string{
		"Table":                s.qualified,
		"PayloadType":          map[bool]string{true: "bytea", false: "jsonb"}[t.Payload == outboxdriver.PayloadBytes],
		"UnpublishedIndex":     pgx.Identifier{t.Derived("_unpublished_idx")}.Sanitize(),
		"FailingIndex":         pgx.Identifier{t.Derived("_failing_idx")}.Sanitize(),
		"DeadTable":            s.dead,
		"DeadHoldIndex":        pgx.Identifier{t.Derived("_dead_holds_idx")}.Sanitize(),
		"Partitioned":          map[bool]string{true: "yes"}[t.Partitioned],
		"DefaultPartition":     pgx.Identifier{t.Schema, t.Derived("_default")}.Sanitize(),
		"CDCTable":             s.cdc,
		"Partitions":           strconv.Itoa(t.Partitions),
		"PartitionIndex":       pgx.Identifier{t.Derived("_partition_idx")}.Sanitize(),
		"RelaysTable":          s.relays,
		"LeasesTable":          s.leases,
		"PublishedTable":       s.published,
		"PublishedIndex":       pgx.Identifier{t.Derived("_published_at_idx")}.Sanitize(),
		"PublishedDefault":     pgx.Identifier{t.Schema, t.Derived("_published_default")}.Sanitize(),
		"PublishedDefaultName": pgx.Identifier{t.Derived("_published_default")}.Sanitize(),
		"PublishedDayIndex":    pgx.Identifier{t.Derived("_published_day_idx")}.Sanitize(),
		"ReplaysTable":         pgx.Identifier{t.Schema, t.Derived("_replays")}.Sanitize(),
		"CleanupIndex":         pgx.Identifier{t.Derived("_cleanup_idx")}.Sanitize(),
	})
}

func (s *Statements) versionTable() string {
	return pgx.Identifier{s.table.Schema, s.table.Derived("_migrations")}.Sanitize()
}

// Migrator implements outboxdriver.Migrator.
type Migrator struct {
	Statements *Statements
	DB         DB
}

// SQL implements outboxdriver.Migrator: every migration, with the bookkeeping, as one
// script a team can run with its own tool.
func (m *Migrator) SQL() (string, error) {
	ms, err := m.Statements.Migrations()
	if err != nil {
		return "", err
	}
	script := migrations.Script("outbox schema for "+m.Statements.table.String()+" (PostgreSQL)", ms,
		m.Statements.createVersionTable(), "INSERT INTO "+m.Statements.versionTable()+" (version) VALUES (%d) ON CONFLICT DO NOTHING")
	if m.Statements.table.Partitioned {
		script += "\n-- daily partitions from today; the relay's cleanup creates the next ones\n" +
			strings.Join(m.Statements.partitionDDL(time.Now()), ";\n") + ";\n"
	}
	return script, nil
}

func (s *Statements) createVersionTable() string {
	return "CREATE TABLE IF NOT EXISTS " + s.versionTable() +
		" (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
}

// Schema implements outboxdriver.Migrator.
func (m *Migrator) Schema(ctx context.Context) (*outboxdriver.SchemaState, error) {
	if m.DB == nil {
		return nil, outboxdriver.ErrNoPool
	}
	ms, err := m.Statements.Migrations()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := QueryRow(ctx, m.DB, "SELECT to_regclass($1) IS NOT NULL", []any{m.Statements.versionTable()}, &exists); err != nil {
		return nil, InterpretError(err)
	}
	var done map[int]bool
	if exists {
		rows, err := m.DB.Query(ctx, "SELECT version FROM "+m.Statements.versionTable())
		if err != nil {
			return nil, InterpretError(err)
		}
		done, err = migrations.Versions(rows)
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return outboxdriver.NewSchemaState(migrations.Known(ms), done), nil
}

// Migrate implements outboxdriver.Migrator. It runs in one transaction of its own
// (never a caller's) under a transaction advisory lock, so concurrent migrators
// queue instead of racing.
func (m *Migrator) Migrate(ctx context.Context) (applied []int, err error) {
	if m.DB == nil {
		return nil, outboxdriver.ErrNoPool
	}
	ms, err := m.Statements.Migrations()
	if err != nil {
		return nil, err
	}
	if err := m.DB.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{m.Statements.table.Schema}.Sanitize()); err != nil {
		return nil, InterpretError(err)
	}
	tx, err := m.DB.Begin(ctx)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", m.Statements.lockKey+1); err != nil {
		return nil, err
	}
	if err := tx.Exec(ctx, m.Statements.createVersionTable()); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, "SELECT version FROM "+m.Statements.versionTable())
	if err != nil {
		return nil, err
	}
	done, err := migrations.Versions(rows)
	rows.Close()
	if err != nil {
		return nil, err
	}
	applied, err = migrations.Apply(ms, done, func(mg migrations.Migration) error {
		return tx.Exec(ctx, mg.SQL)
	}, func(v int) error {
		return tx.Exec(ctx, "INSERT INTO "+m.Statements.versionTable()+" (version) VALUES ($1)", v)
	})
	if err != nil {
		return nil, err
	}
	if m.Statements.table.Partitioned {
		if err := m.Statements.ensurePartitions(ctx, tx, time.Now()); err != nil {
			return nil, err
		}
	}
	return applied, tx.Commit(ctx)
}
