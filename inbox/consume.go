package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrPermanent marks a failure no redelivery can fix (a message with no event id, a
// payload the handler can never accept). The consumer loops (natsinbox, amqpinbox,
// kafkainbox, redisinbox) stop redelivering such a message: JetStream terminates it,
// RabbitMQ rejects it to the queue's dead-letter exchange, Kafka and Redis skip it;
// each is logged with its error.
var ErrPermanent = errors.New("inbox: permanent failure")

// Permanent wraps a handler's error as permanent.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// IsPermanent reports whether err is permanent (ErrNoID is).
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// Defaults for ConsumeOptions.
const (
	RetryMinDefault = 100 * time.Millisecond
	RetryMaxDefault = 30 * time.Second
)

// ConsumeOptions configure the consumer loops. Nil gives the defaults.
type ConsumeOptions struct {
	// Logger receives every failed delivery. Default slog.Default().
	Logger *slog.Logger
	// RetryMin and RetryMax bound the wait before a failed message comes again
	// (doubling per failed attempt). Defaults RetryMinDefault, RetryMaxDefault.
	RetryMin, RetryMax time.Duration
}

// Retrier is the redelivery policy the consumer loops share: it logs a failure and
// says how long to wait before the message comes again. Build it with NewRetrier.
type Retrier struct {
	opts ConsumeOptions
}

// NewRetrier applies the defaults to opts.
func NewRetrier(opts *ConsumeOptions) *Retrier {
	var o ConsumeOptions
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RetryMin <= 0 {
		o.RetryMin = RetryMinDefault
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(RetryMaxDefault, o.RetryMin)
	}
	return &Retrier{opts: o}
}

// Failed logs the failure of m's attempt-th delivery (1 for the first) and returns how
// long to wait before it comes again; permanent reports that it must not come again.
func (r *Retrier) Failed(consumer string, m *Message, attempt int, err error) (wait time.Duration, permanent bool) {
	if IsPermanent(err) {
		r.opts.Logger.Error("inbox: message failed permanently; not redelivered", "consumer", consumer, "id", m.ID,
			"aggregatetype", m.AggregateType, "aggregateid", m.AggregateID, "err", err)
		return 0, true
	}
	wait = r.opts.RetryMin
	for i := 1; i < attempt && wait < r.opts.RetryMax; i++ {
		wait *= 2
	}
	wait = min(wait, r.opts.RetryMax)
	r.opts.Logger.Warn("inbox: handler failed; the message comes again", "consumer", consumer, "id", m.ID,
		"attempt", attempt, "retry_in", wait, "err", err)
	return wait, false
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
