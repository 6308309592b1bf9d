package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
)

func (s *Source) slotInfo(ctx context.Context) (slotInfo, error) {
	return slotInfoOf(ctx, s.pool, s.cfg.Slot)
}

func slotInfoOf(ctx context.Context, pool *pgxpool.Pool, slot string) (slotInfo, error) {
	var si slotInfo
	var confirmed *string
	err := pool.QueryRow(ctx, `SELECT active, coalesce(wal_status, ''), confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		slot).Scan(&si.active, &si.walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return si, nil
	}
	if err != nil {
		return si, err
	}
	si.exists = true
	if confirmed != nil {
		si.confirmed, err = pglogrepl.ParseLSN(*confirmed)
	}
	return si, err
}

type slotInfo struct {
	exists, active bool
	walStatus      string
	confirmed      pglogrepl.LSN
}

// lost reports whether WAL the slot had not confirmed may be gone: PostgreSQL
// invalidated it, or it was dropped after it had streamed (streamed: a table it
// served finished its backfill).
func (si slotInfo) lost(streamed bool) bool {
	return (si.exists && si.walStatus == "lost") || (!si.exists && streamed)
}

func (si slotInfo) lostError(slot string) error {
	status := si.walStatus
	if !si.exists {
		status = "dropped"
	}
	return fmt.Errorf("%w (%w): slot %q (wal_status %q): events written since its last confirmed position may be gone from the WAL; "+
		"recover with `outbox relay --mode cdc --recreate-slot` (docs/cdc.md)", ErrSlotLost, outboxdriver.ErrNeedsOperator, slot, status)
}

// streamedBefore reports whether the table's backfill from the slot finished: the
// slot streamed the table before.
func (s *Source) streamedBefore(ctx context.Context) (bool, error) {
	var streamed bool
	err := s.pool.QueryRow(ctx, `SELECT backfilled_at IS NOT NULL FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot).Scan(&streamed)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return streamed, nil
}

// Init creates the publication and the replication slot when they are missing, so
// that events written from now on are captured even before a relay first runs. The
// insert-delete and table-less write modes leave nothing in the table for a backfill:
// run Init (`outbox migrate --cdc`) before their producers start.
func (s *Source) Init(ctx context.Context) error {
	if err := s.checkServer(ctx); err != nil {
		return err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return err
	}
	si, err := s.slotInfo(ctx)
	if err != nil || si.exists {
		return err
	}
	conn, err := s.connect(ctx, 0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = createSlot(ctx, conn, s.cfg.Slot, s.log, s)
	return err
}

// checkServer refuses a server without logical decoding, warns when slots may keep
// WAL without limit, and learns the payload column's type for the dead letters.
func (s *Source) checkServer(ctx context.Context) error {
	if s.shared == nil {
		unbounded, err := checkWALLevel(ctx, s.pool)
		if err != nil {
			return err
		}
		if unbounded {
			s.log.Warn(unboundedWarning, "slot", s.cfg.Slot)
		}
	}
	var payloadType string
	err := s.pool.QueryRow(ctx, `SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'payload'`,
		s.qDead).Scan(&payloadType)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	s.bytesPayload = payloadType == "bytea"
	s.deadLetterStmt = deadLetterStatement(s.qTable, s.qDead, s.bytesPayload)
	// The claim's hold rule (sqlrules.NotHeldSQL), asked of one aggregate. The lock
	// waits for a replay or purge of the holding dead letter whose commit reached the
	// stream before it became visible (see visible.go): unlocked, the check would
	// still see the holder and bury the replayed events behind it.
	s.heldStmt = `SELECT EXISTS (SELECT FROM ` + s.qDead + ` AS d WHERE d.holds_key
  AND d.aggregatetype = $1 AND d.aggregateid = $2 FOR KEY SHARE)`
	return nil
}

// checkWALLevel refuses a server without logical decoding, and reports whether
// slots may keep WAL without limit (unboundedWarning).
func checkWALLevel(ctx context.Context, pool *pgxpool.Pool) (unbounded bool, err error) {
	var walLevel, keep string
	err = pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size')`).Scan(&walLevel, &keep)
	if err != nil {
		return false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if walLevel != "logical" {
		return false, fmt.Errorf("%w (it is %s; %w)", ErrWALLevel, walLevel, outboxdriver.ErrNeedsOperator)
	}
	return keep == "-1", nil
}

const unboundedWarning = "pgcdc: max_slot_wal_keep_size is unset: a stopped relay's slot keeps WAL without limit; set it and watch the slot lag"

func (s *Source) connect(ctx context.Context, walSenderTimeout time.Duration) (*pgconn.PgConn, error) {
	return connectReplication(ctx, s.pool, walSenderTimeout)
}

// connectReplication opens a replication connection to pool's database.
func connectReplication(ctx context.Context, pool *pgxpool.Pool, walSenderTimeout time.Duration) (*pgconn.PgConn, error) {
	rcfg := pool.Config().ConnConfig.Config.Copy()
	if rcfg.RuntimeParams == nil {
		rcfg.RuntimeParams = map[string]string{}
	}
	rcfg.RuntimeParams["replication"] = "database"
	rcfg.RuntimeParams["application_name"] = "outbox relay (cdc)"
	if walSenderTimeout > 0 {
		rcfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(walSenderTimeout.Milliseconds(), 10)
	}
	conn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: replication connection: %w", err)
	}
	return conn, nil
}

// createSlot registers the slot with each of its tables, creates it, records each
// table's backfill bound, and returns the slot's consistent point.
func createSlot(ctx context.Context, conn *pgconn.PgConn, slot string, log *slog.Logger, tables ...*Source) (pglogrepl.LSN, error) {
	// Register first: if the relay dies right after creating the slot, the next
	// start still knows the rows before it need publishing.
	for _, s := range tables {
		reset := "backfill_until = NULL, backfilled_at = NULL"
		if s.shared != nil {
			reset += ", done_lsn = NULL" // migration 010; a table alone does without
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1)
ON CONFLICT (slot) DO UPDATE SET created_at = now(), `+reset, slot); err != nil {
			return 0, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return 0, fmt.Errorf("pgcdc: create slot %q: %w", slot, err)
	}
	log.Info("pgcdc: replication slot created", "slot", slot, "consistent_point", res.ConsistentPoint)
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("pgcdc: %w", err)
	}
	// Every row committed before the slot existed has a seq at most this (a later
	// maximum would only add duplicates).
	for _, s := range tables {
		if _, err := s.pool.Exec(ctx, `UPDATE `+s.qCDC+` SET backfill_until = (SELECT coalesce(max(seq), 0) FROM `+s.qTable+`)
WHERE slot = $1`, slot); err != nil {
			return 0, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	return lsn, nil
}

func (s *Source) ensurePublication(ctx context.Context) error {
	exists, err := publicationExists(ctx, s.pool, s.cfg.Publication)
	if err != nil {
		return err
	}
	if exists {
		return s.checkPublication(ctx)
	}
	_, err = s.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{s.cfg.Publication}.Sanitize()+` FOR TABLE `+s.qTable+
		` WITH (publish = 'insert', publish_via_partition_root = true)`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created meanwhile by another relay
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgcdc: create publication: %w", interpret(err))
	}
	return nil
}

// checkPublication refuses a publication that does not publish this table's inserts,
// or that publishes another table too: a slot and publication named for another table
// would have this relay stream (and confirm past) WAL that is not its own, while its
// own rows were never read.
func (s *Source) checkPublication(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1`, s.cfg.Publication)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", err)
	}
	var others []string
	ours := false
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			rows.Close()
			return fmt.Errorf("pgcdc: %w", err)
		}
		if schema == s.table.Schema && (name == s.table.Name || strings.HasPrefix(name, s.table.Name+"_p")) {
			ours = true
			continue
		}
		others = append(others, schema+"."+name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgcdc: %w", err)
	}
	if !ours || len(others) > 0 {
		return fmt.Errorf("%w: publication %q publishes %v, not only %s: it belongs to another table (name this table's slot and publication with --slot/--publication)",
			ErrForeignPublication, s.cfg.Publication, others, s.table)
	}
	return nil
}

func publicationExists(ctx context.Context, pool *pgxpool.Pool, name string) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return exists, nil
}

// dropSlot drops a slot that was not active a moment ago: PostgreSQL refuses if a
// relay started streaming since (ErrSlotActive).
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55006": // object_in_use
		return fmt.Errorf("%w (slot %q)", ErrSlotActive, slot)
	case err != nil:
		return fmt.Errorf("pgcdc: drop slot: %w", interpret(err))
	}
	return nil
}

// ErrSlotActive: a relay streams from the slot; stop it first.
var ErrSlotActive = errors.New("a relay streams from the replication slot: stop every CDC relay of the table first")

// Retired says what Retire dropped.
type Retired struct {
	Slot, Publication bool
}

// Retire undoes Init for a table leaving CDC mode: it drops the replication slot (so
// it no longer keeps WAL on the server), the publication, and the relay's record of
// the slot (so status does not report it lost). It refuses while a relay streams
// from the slot (ErrSlotActive), and a publication that publishes other tables too
// (ErrForeignPublication). Rows the CDC relay published are marked, so a polling
// relay started afterwards sends only the rest. Running it again drops nothing.
func (s *Source) Retire(ctx context.Context) (Retired, error) {
	var r Retired
	si, err := s.slotInfo(ctx)
	if err != nil {
		return r, fmt.Errorf("pgcdc: slot: %w", interpret(err))
	}
	if si.active {
		return r, fmt.Errorf("%w (slot %q)", ErrSlotActive, s.cfg.Slot)
	}
	pub, err := publicationExists(ctx, s.pool, s.cfg.Publication)
	if err != nil {
		return r, err
	}
	if pub {
		if err := s.checkPublication(ctx); err != nil {
			return r, err
		}
	}
	if si.exists {
		if err := dropSlot(ctx, s.pool, s.cfg.Slot); err != nil {
			return r, err
		}
		r.Slot = true
	}
	if pub {
		if _, err := s.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{s.cfg.Publication}.Sanitize()); err != nil {
			return r, fmt.Errorf("pgcdc: drop publication: %w", interpret(err))
		}
		r.Publication = true
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot); err != nil {
		return r, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	return r, nil
}
