// Package pgcdc is the relay's change-data-capture source for PostgreSQL: it reads
// outbox events from the write-ahead log by logical replication (the built-in pgoutput
// plugin) instead of polling the outbox table.
//
// A Source is an outboxdriver.Source (the relay's side of a table; status and dead
// letters stay with the table store), so the relay engine (package relay) runs the
// same publish, retry and dead-letter logic in both modes:
//
//	drv := outboxpgx.New(pool, nil)
//	src, err := pgcdc.ForDriver(drv, nil) // slot outbox_public_outbox, same-named publication
//	err = src.Init(ctx)                   // or `outbox migrate --cdc`: capture starts now
//	r, err := relay.New(src, publisher, nil)
//	err = r.Run(ctx)
//
// Events come from inserts into the outbox table and, in the table-less mode, from
// transactional logical decoding messages written by the writer with
// pg_logical_emit_message (outboxdriver.WriteMessage; package outboxdriver/pgmessage
// is the format).
//
// The parts, from the wire in: Decoder turns pgoutput messages into changes (pure,
// fuzzed); the stream reads the replication connection and reports the confirmed
// position; the queue holds events in commit order and decides which WAL position may
// be confirmed: only one before which every event was acknowledged by the broker or
// put in the dead letters. docs/cdc.md is the operator's guide: set-up, guarantees,
// slot safety and the recovery from a lost slot.
package pgcdc
