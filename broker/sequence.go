package broker

import (
	"context"
	"errors"
	"fmt"
	"github.com/outboxd/outbox/internal/simbug"
	"sync"
	"time"
)

// Sequence is the one sequencing engine every publisher plugs into. The publisher
// says how to prepare, send and classify one message; Sequence decides each
// message's fate by the project's rule, a failure belongs to the message that caused
// it unless it provably belongs to the connection:
//
//   - hold: once a message of a key (its aggregate type and key) fails, the key's later
//     messages of the batch are not sent (ErrHeldBack: no attempt), so none overtakes it;
//     a later message already sent whose answer is a failure too is held back as well,
//     never charged (a client that fails a key's bundle as a whole);
//   - defer: a destination that is not ready (ErrDeferred) defers the rest of the
//     batch's messages to it, and holds their keys; other destinations go on;
//   - stop: a failure of the connection (ErrUnavailable) or the end of ctx sends
//     nothing more: every message not yet sent gets that error, no attempt charged;
//   - admit: Prepare makes, before anything is sent, every check the broker would make
//     (sizes, names, header syntax, protocol limits): a message it would refuse, or that
//     would make the server close the connection, fails alone, before sending;
//   - deadline: each answer is awaited at most Schedule.AckTimeout (counted from the
//     last send of the batch, or from the message's own in a sequential schedule); an
//     answer that does not come is the connection's failure.
//
// The results are one per message, in msgs order.
//
// Under a context from WithAnswers for msgs, each result is also reported as soon as
// it is decided.
func Sequence(ctx context.Context, msgs []Message, sch Schedule, s Sender) []Result {
	q := &sequencer{ctx: ctx, msgs: msgs, s: s, sch: sch, res: make([]Result, len(msgs))}
	if a, ok := ctx.Value(answersKey{}).(*answers); ok && a.of(msgs) {
		q.report = a.fn
	}
	switch {
	case sch.Sequential && s.Flush != nil:
		q.rounds()
	case sch.Sequential:
		q.sequential()
	default:
		q.pipelined()
	}
	return q.res
}

// Schedule is how a publisher's broker takes messages.
type Schedule struct {
	// Sequential: the broker keeps no order between messages in flight (HTTP,
	// MQTT, SQS batches): a key's next message is sent only after the previous one
	// was acknowledged, up to Concurrency keys at once; with a Flush, in rounds (each
	// round queues the next message of every key, flushes them together, and awaits
	// their answers). Otherwise (pipelined) every message is sent in order, flushed,
	// then the answers are awaited.
	Sequential  bool
	Concurrency int
	// AckTimeout bounds the wait for an answer (0: only ctx bounds it).
	AckTimeout time.Duration
}

// Sender is a publisher's part in Sequence. Each function takes the message's index
// in the batch, so a publisher keeps what Prepare rendered for Send in a slice of its
// own. Send is never called for a message whose Prepare failed.
type Sender struct {
	// Prepare checks and renders message i. Its error is already classified:
	// Permanent (the message will never go), Deferred (its destination is not
	// ready), Unavailable (the connection), or a plain error (retry the message).
	Prepare func(ctx context.Context, i int) error
	// Send sends (or queues, see Flush) message i and returns its answer to come.
	Send func(ctx context.Context, i int) (Future, error)
	// Flush, if set, sends what Send queued (a pipeline, a round of batches) before
	// the answers are awaited; its error is the connection's for every message
	// queued since the last flush.
	Flush func(ctx context.Context) error
	// Classify, if set, maps the client's errors from Send, Flush and Wait to the
	// classes above; it is not asked about an error already classified.
	Classify func(err error) error
}

// Future is the answer to come for one sent message.
type Future interface {
	// Wait returns nil once the broker acknowledged the message, or the failure it
	// answered; an answer already come is returned even when ctx has ended.
	// Otherwise it returns ctx's error when ctx ends.
	Wait(ctx context.Context) error
}

// Answered is a Future whose answer is known at once (a synchronous send).
type Answered struct{ Err error }

// Wait implements Future.
func (a Answered) Wait(context.Context) error { return a.Err }

// ErrNoAnswer is the failure of a message whose answer did not come within
// Schedule.AckTimeout: the connection's (a cut network, a paused server).
var ErrNoAnswer = errors.New("no answer from the broker in time")

type answersKey struct{}

type answers struct {
	msgs []Message
	fn   func(i int, r Result)
}

// of reports whether msgs is the batch the answers were asked for (not a part of
// it a publisher sequences on its own, whose indexes would differ).
func (a *answers) of(msgs []Message) bool {
	return len(msgs) == len(a.msgs) && (len(msgs) == 0 || &msgs[0] == &a.msgs[0])
}

// WithAnswers returns a context under which Sequence, publishing msgs, calls fn with
// each message's index and result as soon as that result is decided: once per
// message, from whichever goroutine decided it. The relay uses it to write back what
// the broker answered while a slow key's answers are still out. A publisher that
// does not publish through Sequence reports nothing early: every result then comes
// when Publish returns.
func WithAnswers(ctx context.Context, msgs []Message, fn func(i int, r Result)) context.Context {
	return context.WithValue(ctx, answersKey{}, &answers{msgs: msgs, fn: fn})
}

type sequencer struct {
	ctx    context.Context
	msgs   []Message
	s      Sender
	sch    Schedule
	res    []Result
	report func(i int, r Result) // WithAnswers' fn, or nil

	mu       sync.Mutex
	stop     error
	held     map[string]error // key -> the failure that holds it
	deferred map[string]error // topic -> its deferral
}

func seqKey(m *Message) string { return m.AggregateType + "\x00" + m.Key }

// admit decides whether message i may be sent: not after a stop, behind a held key
// or to a deferred destination, nor when Prepare refuses it. If not, its result is
// set.
func (q *sequencer) admit(i int) bool {
	m := &q.msgs[i]
	q.mu.Lock()
	if q.stop == nil && q.ctx.Err() != nil {
		q.stop = q.ctx.Err()
	}
	var err error
	switch {
	case q.stop != nil:
		err = q.stop
	case q.held[seqKey(m)] != nil && !simbug.On("sequence-no-holdback"):
		err = fmt.Errorf("%w (%v)", ErrHeldBack, q.held[seqKey(m)]) //nolint:errorlint // held back, not failed: the cause is told, not wrapped, or errors.As would find a permanent failure in it
	case q.deferred[m.Topic] != nil:
		err = q.deferred[m.Topic]
		q.hold(m, err)
	}
	q.mu.Unlock()
	if err != nil {
		q.decide(i, err)
		return false
	}
	if err := q.s.Prepare(q.ctx, i); err != nil {
		q.fail(i, err)
		return false
	}
	return true
}

// fail records message i's failure and what follows from it for the others.
func (q *sequencer) fail(i int, err error) {
	if q.ctx.Err() != nil {
		err = q.ctx.Err() // ended, not refused: no attempt is charged
	}
	m := &q.msgs[i]
	q.mu.Lock()
	defer q.decide(i, err) // once what follows for the others is recorded
	defer q.mu.Unlock()
	switch {
	case IsUnavailable(err), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if q.stop == nil {
			q.stop = err
		}
	case IsDeferred(err):
		if q.deferred == nil {
			q.deferred = map[string]error{}
		}
		q.deferred[m.Topic] = err
		q.hold(m, err)
	default:
		q.hold(m, err)
	}
}

// hold holds m's key behind err. q.mu is held.
func (q *sequencer) hold(m *Message, err error) {
	if q.held == nil {
		q.held = map[string]error{}
	}
	if k := seqKey(m); q.held[k] == nil {
		q.held[k] = err
	}
}

// classify asks the publisher's Classify about a client's error; an error already
// classified (Permanent, Deferred, Unavailable, HeldBack) stays as it is.
func (q *sequencer) classify(err error) error {
	if err == nil || q.s.Classify == nil || IsPermanent(err) || IsDeferred(err) || IsUnavailable(err) || IsHeldBack(err) {
		return err
	}
	return q.s.Classify(err)
}

// send sends message i and returns its future, or nil if it failed.
func (q *sequencer) send(i int) Future {
	f, err := q.s.Send(q.ctx, i)
	if err != nil {
		q.fail(i, q.classify(err))
		return nil
	}
	return f
}

// await waits for f's answer, at most until actx ends.
func (q *sequencer) await(actx context.Context, i int, f Future) {
	err := f.Wait(actx)
	if err != nil && actx.Err() != nil && q.ctx.Err() == nil && errors.Is(err, actx.Err()) {
		err = Unavailable(fmt.Errorf("%w (%v)", ErrNoAnswer, q.sch.AckTimeout))
	} else {
		err = q.classify(err)
	}
	if err != nil && !IsUnavailable(err) && q.ctx.Err() == nil {
		q.mu.Lock()
		first := q.held[seqKey(&q.msgs[i])]
		q.mu.Unlock()
		if first != nil {
			// An earlier message of its key failed already: this one waits behind
			// it whatever its own answer, and is not charged for it.
			err = fmt.Errorf("%w (%v)", ErrHeldBack, err) //nolint:errorlint // held back, not failed: the cause is told, not wrapped, or errors.As would find a permanent failure in it
		}
	}
	if err != nil {
		q.fail(i, err)
		return
	}
	q.decide(i, nil)
}

// decide sets message i's result, and reports it (WithAnswers).
func (q *sequencer) decide(i int, err error) {
	q.res[i].Err = err
	if q.report != nil {
		q.report(i, q.res[i])
	}
}

// deadline is the context an answer is awaited under.
func (q *sequencer) deadline() (context.Context, context.CancelFunc) {
	if q.sch.AckTimeout > 0 {
		return context.WithTimeout(q.ctx, q.sch.AckTimeout)
	}
	return context.WithCancel(q.ctx)
}

// pipelined sends every admitted message in order, flushes, then awaits the answers.
func (q *sequencer) pipelined() {
	futures := make([]Future, len(q.msgs))
	sent := false
	for i := range q.msgs {
		if q.admit(i) {
			futures[i] = q.send(i)
			sent = sent || futures[i] != nil
		}
	}
	if sent {
		q.flushAndAwait(futures)
	}
}

// flushAndAwait flushes what was queued and awaits the answers of futures (nil for
// a message not sent).
func (q *sequencer) flushAndAwait(futures []Future) {
	if q.s.Flush != nil {
		if err := q.s.Flush(q.ctx); err != nil {
			err = q.classify(err)
			if !IsUnavailable(err) && q.ctx.Err() == nil {
				err = Unavailable(err)
			}
			for i, f := range futures {
				if f != nil {
					q.fail(i, err)
				}
			}
			return
		}
	}
	actx, cancel := q.deadline()
	defer cancel()
	for i, f := range futures {
		if f != nil {
			q.await(actx, i, f)
		}
	}
}

// rounds sends, in each round, the next message of every key, flushes them
// together and awaits their answers; a key's next message waits for the next round.
func (q *sequencer) rounds() {
	byKey, keys := q.byKey()
	next := make(map[string]int, len(keys))
	for {
		futures := make([]Future, len(q.msgs))
		sent := false
		for _, k := range keys {
			idx := byKey[k]
			for next[k] < len(idx) { // the key's next message that goes out, if any
				i := idx[next[k]]
				next[k]++
				if q.admit(i) {
					futures[i] = q.send(i)
					sent = sent || futures[i] != nil
					break
				}
			}
		}
		if !sent {
			return
		}
		q.flushAndAwait(futures)
	}
}

// byKey groups the messages' indexes by key, keys in order of first appearance.
func (q *sequencer) byKey() (map[string][]int, []string) {
	byKey := map[string][]int{}
	var keys []string
	for i := range q.msgs {
		k := seqKey(&q.msgs[i])
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	return byKey, keys
}

// sequential runs each key's messages one after another, each sent only after the
// previous one was acknowledged, Concurrency keys at once.
func (q *sequencer) sequential() {
	byKey, keys := q.byKey()
	sem := make(chan struct{}, max(q.sch.Concurrency, 1))
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func(idx []int) {
			defer wg.Done()
			defer func() { <-sem }()
			for _, i := range idx {
				if !q.admit(i) {
					continue
				}
				if f := q.send(i); f != nil {
					actx, cancel := q.deadline()
					q.await(actx, i, f)
					cancel()
				}
			}
		}(byKey[k])
	}
	wg.Wait()
}
