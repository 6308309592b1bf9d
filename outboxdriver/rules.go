package outboxdriver

// The claim's ordering rules, as SQL every driver (and the CDC backfill) puts in its
// claim, so each rule is written once. They read the outbox row under the alias o;
// table and dead are the quoted outbox and dead-letter tables. The text is the same
// in PostgreSQL, MySQL/MariaDB and SQLite.

// NotBehindFailingSQL: the row is not behind an earlier unpublished row of its
// aggregate that failed (attempts > 0): a failing event is retried alone, and its
// aggregate's later events follow only after it succeeds or dies.
func NotBehindFailingSQL(table string) string {
	return `NOT EXISTS (SELECT 1 FROM ` + table + ` AS f WHERE f.published_at IS NULL AND f.attempts > 0
                  AND f.aggregatetype = o.aggregatetype AND f.aggregateid = o.aggregateid AND f.seq < o.seq)`
}

// NotHeldSQL: the row's aggregate is not held by a dead letter (quarantined until the
// dead letter is replayed or purged).
func NotHeldSQL(dead string) string {
	return `NOT EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.holds_key
                  AND d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid)`
}

// DeadLetterColumns are the dead-letter columns a move to the dead letters fills, in
// the order the PostgreSQL statements (the polling store's and the CDC source's)
// list them; dead_at takes its default.
const DeadLetterColumns = "id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, attempts, error, holds_key"

// WaitingBehindDeadLetter is the error of a dead letter that did not fail: the CDC
// source, which cannot keep a held aggregate's later events in memory, moves them to
// the dead letters behind the one holding it, in order. Replaying or purging that one
// brings them back to the outbox after it (PostgreSQL's Admin does it).
const WaitingBehindDeadLetter = "waiting behind a dead letter of its aggregate (published once that one is replayed or purged)"
