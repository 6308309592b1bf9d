package relay

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
)

// Defaults for Config.
const (
	BatchSizeDefault     = 1000
	BatchBytesDefault    = 16 << 20
	PollIntervalDefault  = 500 * time.Millisecond
	NotifyLingerDefault  = 60 * time.Millisecond
	LeaderRetryDefault   = time.Second
	LeaderCheckDefault   = time.Second
	LeaderTimeoutDefault = 10 * time.Second
	// LeaderTimeoutMax is the longest LeaderTimeout: a day.
	LeaderTimeoutMax = 24 * time.Hour
	// PollIntervalMin is the shortest PollInterval.
	PollIntervalMin     = time.Millisecond
	BackoffMinDefault   = 100 * time.Millisecond
	BackoffMaxDefault   = 30 * time.Second
	DrainTimeoutDefault = 30 * time.Second
	// StragglerAfterDefault is Config.StragglerAfter's default.
	StragglerAfterDefault = 500 * time.Millisecond
	MaxAttemptsDefault    = 10
	RetryMinDefault       = time.Second
	RetryMaxDefault       = 5 * time.Minute
	RetentionDefault      = 7 * 24 * time.Hour
	CleanupEveryDefault   = time.Minute
	CleanupBatchDefault   = 1000
)

// Router makes the broker message for a row. escape (may be nil) is the publisher's
// escaper for values placed in a topic. An error fails the row permanently.
type Router interface {
	Route(row *outboxdriver.Row, escape func(string) string) (broker.Message, error)
}

// ColumnRouter is a Router that reads columns of the table beyond the outbox's own
// (Row.Columns): the relay claims them too (outboxdriver.ClaimParams.Columns).
type ColumnRouter interface {
	Router
	Columns() []string
}

// Outcome is what happened to one row of a batch.
type Outcome struct {
	Row   *outboxdriver.Row
	Topic string // "" when the row could not be routed
	Err   error  // nil: the broker acknowledged it
}

// Hooks observe the relay. Calls come from the relay's goroutines: keep them fast.
type Hooks interface {
	// BatchPublished reports a batch after the broker answered for every row. Two
	// calls may overlap (a slow key's batch answered while the next batch's is).
	BatchPublished(outcomes []Outcome, publishTime time.Duration)
	// LeaderChanged reports whether this relay became (true) or stopped being the
	// active one.
	LeaderChanged(leader bool)
}

// GroupHooks, implemented by a Hooks value as well, is told how many partitions this
// relay owns whenever that changes (group mode).
type GroupHooks interface {
	PartitionsOwned(n int)
}

// ClaimHooks, implemented by a Hooks value as well, is told of each claim that
// succeeded: how many rows it took and how long the store took to claim them (on
// PostgreSQL, the claim's reads and locks; in CDC mode, taking events from the stream).
// A polling claim's time grows with the rows published since the table's last
// vacuum (docs/operations.md, "Vacuum and the polling claim").
type ClaimHooks interface {
	Claimed(rows int, took time.Duration)
}

// PublishTracer traces publishing. StartPublish is called just before a batch goes to
// the broker; it may rewrite each message's trace headers (traceparent, tracestate) so
// consumers continue from the publish span. The returned func is called with the
// broker's results.
type PublishTracer interface {
	StartPublish(msgs []broker.Message) (end func(results []broker.Result))
}

// Config configures a Relay. The zero value (or nil) gives the defaults.
type Config struct {
	// BatchSize is the most rows claimed and published at once.
	BatchSize int
	// PollInterval is how often the relay looks for work when no notification wakes
	// it: the safety net for missed notifications and plain-SQL producers.
	PollInterval time.Duration
	// NotifyLinger is how soon after a notification-driven pass the relay looks
	// once more, for writes whose own notification the writer debounced.
	NotifyLinger time.Duration
	// MaxBatchBytes bounds a batch by its payloads' size as well: a claim stops once
	// it holds this many bytes (a larger single event still goes, alone). Zero
	// means BatchBytesDefault; negative: no bound.
	MaxBatchBytes int
	// Completion is what becomes of a row once published: stamped (mark, the
	// default), deleted, or moved to the archive table (PostgreSQL).
	Completion outboxdriver.Completion

	// TopicTemplate makes the topic of each event. Default
	// broker.TopicTemplateDefault ("outbox.event.${aggregatetype}").
	TopicTemplate string
	// LeaderRetry is how often a standby tries to become the active relay.
	LeaderRetry time.Duration
	// LeaderCheck is how often the active relay checks it still leads (its heartbeat;
	// at most a quarter of LeaderTimeout).
	LeaderCheck time.Duration
	// LeaderTimeout bounds how long the database keeps the leadership of an active
	// relay that stopped proving it is alive (paused, cut off, half-open connection):
	// PostgreSQL ends its session (idle_session_timeout, TCP keepalives and
	// tcp_user_timeout; wal_sender_timeout for CDC), MySQL its wait_timeout, and a
	// standby takes over. The relay stops publishing on its own after three quarters
	// of it without a heartbeat. Every database call of the relay has it as a
	// deadline. Default LeaderTimeoutDefault. (SQLite's lease TTL plays this part.)
	LeaderTimeout time.Duration
	// BackoffMin and BackoffMax bound the exponential backoff (with jitter) after a
	// failed pass.
	BackoffMin, BackoffMax time.Duration
	// DrainTimeout bounds how long shutdown waits for in-flight work.
	DrainTimeout time.Duration
	// StragglerAfter is how long a batch waits, once its answers stop coming while
	// some keys' are still out (a receiver holding one aggregate's requests), before
	// it writes back what was answered and leaves those keys in flight: a slow key
	// holds only itself, and its aggregate's later events wait for it (see
	// docs/architecture.md). It needs a store that completes claims in parts
	// (outboxdriver.Capabilities.Split) and no ledger; a group member keeps a slow
	// key's partition until its answers came. Zero means
	// StragglerAfterDefault; negative: every batch waits for all of its answers.
	StragglerAfter time.Duration
	// MaxAttempts is how many times the broker may refuse an event before it moves to
	// the dead letters. A permanent refusal (too large, invalid) moves it at once;
	// an unreachable broker never counts. Default MaxAttemptsDefault.
	MaxAttempts int
	// RetryMin and RetryMax bound the per-event backoff (exponential, with jitter)
	// between attempts of a refused event. Defaults RetryMinDefault, RetryMaxDefault.
	RetryMin, RetryMax time.Duration
	// Retention is how long published rows are kept before the active relay deletes
	// them, in batches of CleanupBatch every CleanupEvery. Zero means
	// RetentionDefault; negative disables cleanup. Unpublished rows are never deleted.
	Retention    time.Duration
	CleanupEvery time.Duration
	CleanupBatch int
	// FlowPastDeadLetters lets the later events of a dead letter's aggregate go on.
	// By default they wait (the aggregate is quarantined) until the dead letter is
	// replayed or purged, so the aggregate's order is kept.
	FlowPastDeadLetters bool
	// Logger receives the relay's logs. Default: slog.Default().
	Logger *slog.Logger
	// Router, when set, makes the message of each row instead of the default wire
	// format (debezium.Router emits what Debezium's Outbox Event Router would).
	// TopicTemplate is then unused.
	Router Router
	// Tracer, when set, wraps each batch's publishing in spans that continue the
	// producers' traces (outboxotel.PublishTracer for OpenTelemetry).
	Tracer PublishTracer
	// Hooks, when set, is told about every batch (metrics adapters implement it:
	// see package relay/relayprom). The relay itself depends on no metrics library.
	Hooks Hooks
	// Rand, when set, is the source of every jitter the relay draws (its backoffs and
	// retry delays); nil: a random one. A deterministic simulation sets it so that a
	// seed replays its schedule (docs/testing.md). It is used under a lock of the
	// relay's own.
	Rand rand.Source
	// Group, when set, makes this relay one of several active relays of the table,
	// each owning some of its partitions (the store must be an
	// outboxdriver.GroupStore: PostgreSQL). Without it one relay is active and the
	// others wait.
	Group *GroupConfig
}

// GroupConfig configures a member of a group of active relays.
type GroupConfig struct {
	// RelayID names this relay; unique in the group. Default DefaultRelayID().
	RelayID string
	// LeaseTTL is how long a partition lease lasts unrenewed: a relay that dies or
	// pauses loses its partitions this long after its last renewal (renewals come
	// every third of it). Default LeaseTTLDefault.
	LeaseTTL time.Duration
}

// LeaseTTLDefault is GroupConfig.LeaseTTL's default.
const LeaseTTLDefault = 10 * time.Second

// Validate reports whether the configuration is usable (New checks the same), so a
// command line can refuse bad flags before connecting to anything.
func (c *Config) Validate() error {
	_, _, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, *broker.Template, error) {
	var out Config
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	if out.MaxBatchBytes == 0 {
		out.MaxBatchBytes = BatchBytesDefault
	}
	def(&out.PollInterval, PollIntervalDefault)
	def(&out.NotifyLinger, NotifyLingerDefault)
	def(&out.LeaderRetry, LeaderRetryDefault)
	def(&out.LeaderCheck, LeaderCheckDefault)
	def(&out.LeaderTimeout, LeaderTimeoutDefault)
	def(&out.BackoffMin, BackoffMinDefault)
	def(&out.BackoffMax, BackoffMaxDefault)
	def(&out.DrainTimeout, DrainTimeoutDefault)
	def(&out.StragglerAfter, StragglerAfterDefault)
	def(&out.RetryMin, RetryMinDefault)
	def(&out.Retention, RetentionDefault)
	def(&out.CleanupEvery, CleanupEveryDefault)
	if out.CleanupBatch == 0 {
		out.CleanupBatch = CleanupBatchDefault
	}
	def(&out.RetryMax, RetryMaxDefault)
	if out.MaxAttempts == 0 {
		out.MaxAttempts = MaxAttemptsDefault
	}
	if out.TopicTemplate == "" {
		out.TopicTemplate = broker.TopicTemplateDefault
	}
	completion, err := outboxdriver.ParseCompletion(string(out.Completion))
	if err != nil {
		return out, nil, fmt.Errorf("relay: %w", err)
	}
	out.Completion = completion
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Group != nil {
		g := *out.Group
		if g.RelayID == "" {
			g.RelayID = DefaultRelayID()
		}
		def(&g.LeaseTTL, LeaseTTLDefault)
		if g.LeaseTTL < 300*time.Millisecond {
			return out, nil, fmt.Errorf("relay: Group.LeaseTTL must be at least 300ms, got %v", g.LeaseTTL)
		}
		out.Group = &g
	}
	switch {
	case out.BatchSize < 1 || out.BatchSize > 100_000:
		return out, nil, fmt.Errorf("relay: BatchSize must be 1..100000, got %d", out.BatchSize)
	case out.PollInterval < 0, out.NotifyLinger < 0, out.LeaderRetry < 0, out.LeaderCheck < 0, out.DrainTimeout < 0:
		return out, nil, fmt.Errorf("relay: durations must not be negative")
	case out.PollInterval < PollIntervalMin:
		// A poll every nanosecond is a transaction loop on an idle table.
		return out, nil, fmt.Errorf("relay: PollInterval must be at least %v, got %v", PollIntervalMin, out.PollInterval)
	case out.LeaderTimeout < 400*time.Millisecond || out.LeaderTimeout > LeaderTimeoutMax:
		// Past the maximum the database's own timeouts (idle_session_timeout, in
		// int32 milliseconds) cannot hold it: such a relay would never lead.
		return out, nil, fmt.Errorf("relay: LeaderTimeout must be 400ms to %v, got %v", LeaderTimeoutMax, out.LeaderTimeout)
	case out.CleanupEvery < 0 || out.CleanupBatch < 1:
		return out, nil, fmt.Errorf("relay: CleanupEvery must not be negative and CleanupBatch must be positive")
	case out.MaxAttempts < 1:
		return out, nil, fmt.Errorf("relay: MaxAttempts must be at least 1, got %d", out.MaxAttempts)
	case out.RetryMin <= 0 || out.RetryMax < out.RetryMin:
		return out, nil, fmt.Errorf("relay: need 0 < RetryMin <= RetryMax, got %v and %v", out.RetryMin, out.RetryMax)
	case out.BackoffMin <= 0 || out.BackoffMax < out.BackoffMin:
		return out, nil, fmt.Errorf("relay: need 0 < BackoffMin <= BackoffMax, got %v and %v", out.BackoffMin, out.BackoffMax)
	}
	tmpl, err := broker.ParseTemplate(out.TopicTemplate)
	if err != nil {
		return out, nil, fmt.Errorf("relay: %w", err)
	}
	return out, tmpl, nil
}
