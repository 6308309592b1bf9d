package outboxdriver

// WaitingBehindDeadLetter is the error of a dead letter that did not fail: the CDC
// source, which cannot keep a held aggregate's later events in memory, moves them to
// the dead letters behind the one holding it, in order. Replaying or purging that one
// brings them back to the outbox after it (PostgreSQL's Admin does it).
const WaitingBehindDeadLetter = "waiting behind a dead letter of its aggregate (published once that one is replayed or purged)"
