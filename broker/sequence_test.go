package broker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/broker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The engine's rules, on a broker of its own made of funcs: it decides each
// message's fate from what Prepare, Send and the answers say. The publishers' own
// suites (brokertest, the poison cases) test it again on every real broker.

// script is a broker whose behaviour per message id is told in advance.
type script struct {
	prepare map[string]error
	send    map[string]error
	answer  map[string]error
	silent  map[string]bool // never answers
	mu      *sync.Mutex
	sent    []string
}

func (s *script) sender(msgs []broker.Message) broker.Sender {
	s.mu = &sync.Mutex{}
	return broker.Sender{
		Prepare: func(_ context.Context, i int) error { return s.prepare[msgs[i].ID] },
		Send: func(_ context.Context, i int) (broker.Future, error) {
			id := msgs[i].ID
			if err := s.send[id]; err != nil {
				return nil, err
			}
			s.mu.Lock()
			s.sent = append(s.sent, id)
			s.mu.Unlock()
			if s.silent[id] {
				return silence{}, nil
			}
			return broker.Answered{Err: s.answer[id]}, nil
		},
	}
}

type silence struct{}

func (silence) Wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

func batch(spec ...string) []broker.Message {
	var out []broker.Message
	for i, s := range spec {
		var topic, key string
		fmt.Sscanf(s, "%s %s", &topic, &key)
		out = append(out, broker.Message{ID: fmt.Sprint(i), Topic: topic, Key: key, AggregateType: "order"})
	}
	return out
}

func errs(res []broker.Result) []string {
	out := make([]string, len(res))
	for i, r := range res {
		switch {
		case r.Err == nil:
			out[i] = "ok"
		case broker.IsHeldBack(r.Err):
			out[i] = "held"
		case broker.IsPermanent(r.Err):
			out[i] = "permanent"
		case broker.IsDeferred(r.Err):
			out[i] = "deferred"
		case broker.IsUnavailable(r.Err):
			out[i] = "unavailable"
		case errors.Is(r.Err, context.Canceled):
			out[i] = "canceled"
		default:
			out[i] = "retry"
		}
	}
	return out
}

func TestSequenceRules(t *testing.T) {
	refused := errors.New("refused")
	for _, tc := range []struct {
		name string
		msgs []broker.Message
		s    script
		want string
		// pipelinedOnly: in a sequential schedule without rounds keys run at once,
		// so which of them a stop or a deferral reaches first varies
		// (TestSequenceStopSequential).
		pipelinedOnly bool
	}{
		{"all acknowledged", batch("t a", "t b", "t a"), script{}, "[ok ok ok]", false},
		{"a refusal found before sending holds its key only",
			batch("t a", "t a", "t b", "t a"), script{prepare: map[string]error{"0": broker.Permanent(refused)}},
			"[permanent held ok held]", false},
		{"a refusal at send holds its key only",
			batch("t a", "t b", "t a"), script{send: map[string]error{"0": refused}}, "[retry ok held]", false},
		{"a destination not ready defers its topic and holds those keys",
			batch("x a", "x b", "t b", "t c", "x c"), script{prepare: map[string]error{"0": broker.Deferred(refused)}},
			"[deferred deferred held ok deferred]", true},
		{"the connection's failure stops the batch",
			batch("t a", "t b", "t c"), script{send: map[string]error{"1": broker.Unavailable(refused)}},
			"[ok unavailable unavailable]", true},
		{"a key's later failed answer is held back, not charged",
			batch("t a", "t a", "t b"), script{answer: map[string]error{"0": refused, "1": refused}}, "[retry held ok]", true},
		{"a refusal in the answer is the message's",
			batch("t a", "t b"), script{answer: map[string]error{"0": broker.Permanent(refused)}}, "[permanent ok]", false},
		{"the same key under another aggregate type is another key",
			[]broker.Message{{ID: "0", Topic: "t", Key: "1", AggregateType: "order"}, {ID: "1", Topic: "t", Key: "1", AggregateType: "user"}},
			script{prepare: map[string]error{"0": broker.Permanent(refused)}}, "[permanent ok]", false},
	} {
		for _, sch := range []string{"pipelined", "sequential", "rounds"} {
			if sch == "sequential" && tc.pipelinedOnly {
				continue
			}
			t.Run(tc.name+"/"+sch, func(t *testing.T) {
				s := tc.s
				sender := s.sender(tc.msgs)
				if sch == "rounds" {
					sender.Flush = func(context.Context) error { return nil }
				}
				var mu sync.Mutex
				told := make([][]broker.Result, len(tc.msgs))
				ctx := broker.WithAnswers(context.Background(), tc.msgs, func(i int, r broker.Result) {
					mu.Lock()
					told[i] = append(told[i], r)
					mu.Unlock()
				})
				res := broker.Sequence(ctx, tc.msgs, broker.Schedule{Sequential: sch != "pipelined", Concurrency: 4}, sender)
				if got := fmt.Sprint(errs(res)); got != tc.want {
					t.Fatalf("results %s, want %s", got, tc.want)
				}
				// Each result was reported early, once, as returned.
				for i := range res {
					if len(told[i]) != 1 || told[i][0] != res[i] {
						t.Fatalf("message %d: reported %v, returned %v", i, told[i], res[i])
					}
				}
			})
		}
	}
}

// TestSequenceStopSequential: in a sequential schedule the keys run at once, so which
// of them a stop reaches first varies; no message after the stop is sent, and every
// message not acknowledged is unavailable.
// TestSequenceAnswersOnlyForTheirBatch: answers asked for one batch are not
// reported for another (a part of it a publisher sequences on its own).
func TestSequenceAnswersOnlyForTheirBatch(t *testing.T) {
	msgs := batch("t a", "t b")
	reported := 0
	ctx := broker.WithAnswers(context.Background(), msgs, func(int, broker.Result) { reported++ })
	part := msgs[1:]
	s := script{}
	broker.Sequence(ctx, part, broker.Schedule{}, s.sender(part))
	if reported != 0 {
		t.Fatalf("%d answers reported for another batch", reported)
	}
}

func TestSequenceStopSequential(t *testing.T) {
	msgs := batch("t a", "t a", "t a", "t b", "t b")
	s := script{send: map[string]error{"1": broker.Unavailable(errors.New("down"))}}
	res := broker.Sequence(context.Background(), msgs, broker.Schedule{Sequential: true, Concurrency: 1}, s.sender(msgs))
	if got := fmt.Sprint(errs(res)); got != "[ok unavailable unavailable unavailable unavailable]" {
		t.Fatalf("results %s", got)
	}
	if fmt.Sprint(s.sent) != "[0]" {
		t.Fatalf("sent %v after the stop", s.sent)
	}
}

// TestSequenceNoAnswer: an answer that does not come within AckTimeout is the
// connection's failure; answers that came are kept.
func TestSequenceNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, sequential := range []bool{false, true} {
			msgs := batch("t a", "t b", "t c")
			s := script{silent: map[string]bool{"1": true}}
			res := broker.Sequence(context.Background(), msgs, broker.Schedule{Sequential: sequential, AckTimeout: 50 * time.Millisecond}, s.sender(msgs))
			got := errs(res)
			if got[0] != "ok" || got[1] != "unavailable" || !errors.Is(res[1].Err, broker.ErrNoAnswer) {
				t.Fatalf("sequential=%v: results %v (%v)", sequential, got, res[1].Err)
			}
		}
	})
}

// TestSequenceCanceled: a batch whose context ended is not charged: nothing more is
// sent and every unsent message carries the context's error.
func TestSequenceCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	msgs := batch("t a", "t b", "t c")
	sent := 0
	s := broker.Sender{
		Prepare: func(context.Context, int) error { return nil },
		Send: func(context.Context, int) (broker.Future, error) {
			sent++
			cancel()
			return broker.Answered{}, nil
		},
	}
	res := broker.Sequence(ctx, msgs, broker.Schedule{}, s)
	if got := fmt.Sprint(errs(res)); got != "[ok canceled canceled]" || sent != 1 {
		t.Fatalf("results %s, %d sent", got, sent)
	}
}

// TestSequenceSequentialOrder: a key's messages go one after another, each after the
// previous one's answer, with and without rounds.
func TestSequenceSequentialOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, rounds := range []bool{false, true} {
			sequentialOrder(t, rounds)
		}
	})
}

func sequentialOrder(t *testing.T, rounds bool) {
	t.Helper()
	var msgs []broker.Message
	for i := 0; i < 40; i++ {
		msgs = append(msgs, broker.Message{ID: fmt.Sprint(i), Topic: "t", Key: fmt.Sprint(i % 4)})
	}
	var mu sync.Mutex
	last := map[string]int{}
	inFlight := map[string]bool{}
	s := broker.Sender{
		Prepare: func(context.Context, int) error { return nil },
		Send: func(_ context.Context, i int) (broker.Future, error) {
			mu.Lock()
			defer mu.Unlock()
			k := msgs[i].Key
			if inFlight[k] {
				return nil, broker.Permanent(errors.New("sent before the previous answer"))
			}
			if p, ok := last[k]; ok && p > i {
				return nil, broker.Permanent(errors.New("out of order"))
			}
			last[k], inFlight[k] = i, true
			return answerLater{done: func() { mu.Lock(); inFlight[k] = false; mu.Unlock() }}, nil
		},
	}
	if rounds {
		s.Flush = func(context.Context) error { return nil }
	}
	res := broker.Sequence(context.Background(), msgs, broker.Schedule{Sequential: true, Concurrency: 4}, s)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
}

type answerLater struct{ done func() }

func (a answerLater) Wait(context.Context) error {
	time.Sleep(time.Millisecond) //nolint:forbidigo // a broker's answer a moment late, on the bubble's virtual clock (synctest)
	a.done()
	return nil
}
