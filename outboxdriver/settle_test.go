package outboxdriver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// TestSettleRecordsEveryRefusal: a database that refuses one row's every record that
// counts an attempt (an index refusing its key) stops no other row, and that row's
// refusal is still recorded, as a retry that counts no attempt and waits a minute.
func TestSettleRecordsEveryRefusal(t *testing.T) {
	refusal := errors.New("index row requires 11480 bytes, maximum size is 8191")
	var written []outboxdriver.Failure
	var published []string
	apply := func(_ context.Context, p *outboxdriver.CompleteParams) error {
		if len(p.Failed) > 1 {
			return refusal // the whole write holds the bad row
		}
		for _, f := range p.Failed {
			if f.ID == "long" && (f.Dead || f.CountAttempt) {
				return refusal
			}
		}
		published = append(published, p.Published...)
		written = append(written, p.Failed...)
		return nil
	}
	before := time.Now()
	err := outboxdriver.Settle(context.Background(), &outboxdriver.CompleteParams{
		Published: []string{"ok"},
		Failed: []outboxdriver.Failure{
			{ID: "first", Error: "refused", CountAttempt: true},
			{ID: "long", Error: "too large", CountAttempt: true, Dead: true, HoldKey: true},
			{ID: "last", Error: "too large", CountAttempt: true, Dead: true},
		},
	}, apply)
	if err != nil {
		t.Fatalf("Settle: %v (every row was recorded in some form)", err)
	}
	if len(published) != 1 || len(written) != 3 {
		t.Fatalf("published %v, failures written %+v: want ok, and first, long and last", published, written)
	}
	long := written[1]
	switch {
	case long.ID != "long" || long.Dead || long.HoldKey || long.CountAttempt:
		t.Fatalf("long recorded as %+v: want a retry that counts no attempt", long)
	case long.RetryAt.Before(before.Add(outboxdriver.DeadLetterRefusedRetry)):
		t.Fatalf("long retries at %v: want at least %v after the refusal", long.RetryAt, outboxdriver.DeadLetterRefusedRetry)
	case !strings.Contains(long.Error, "dead-letter table refused") || !strings.Contains(long.Error, "too large"):
		t.Fatalf("long's error %q: want the refusal and why it was dying", long.Error)
	case written[2].ID != "last" || !written[2].Dead:
		t.Fatalf("last recorded as %+v: want it dead, untouched by long's refusal", written[2])
	}
}

// TestSettleReportsWhatItCouldNotRecord: a row the database refuses in every form is
// named in Settle's error, and the rows after it are still written.
func TestSettleReportsWhatItCouldNotRecord(t *testing.T) {
	var written []string
	err := outboxdriver.Settle(context.Background(), &outboxdriver.CompleteParams{
		Failed: []outboxdriver.Failure{{ID: "gone", Error: "x", CountAttempt: true}, {ID: "next", Error: "y", CountAttempt: true}},
	}, func(_ context.Context, p *outboxdriver.CompleteParams) error {
		if len(p.Failed) > 1 || p.Failed[0].ID == "gone" {
			return errors.New("refused")
		}
		written = append(written, p.Failed[0].ID)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "event gone") {
		t.Fatalf("Settle: %v, want an error naming event gone", err)
	}
	if len(written) != 1 || written[0] != "next" {
		t.Fatalf("written %v, want next", written)
	}
}
