package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox/broker"
)

func TestClassify(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		err                    error
		permanent, unavailable bool
	}{
		{kerr.InvalidRecord, true, false},
		{kerr.MessageTooLarge, true, false},
		{kerr.TopicAuthorizationFailed, true, false},
		{kerr.UnknownTopicOrPartition, false, false}, // the topic's problem: other topics go on
		{kerr.NotLeaderForPartition, false, true},
		{kerr.RequestTimedOut, false, true},
		{kgo.ErrRecordTimeout, false, true},
		{fmt.Errorf("dial tcp: connection refused"), false, true},
		{kerr.PolicyViolation, false, false},
	} {
		got := classify(ctx, tc.err)
		if broker.IsPermanent(got) != tc.permanent || broker.IsUnavailable(got) != tc.unavailable {
			t.Errorf("classify(%v) = %v; want permanent=%v unavailable=%v", tc.err, got, tc.permanent, tc.unavailable)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got := classify(cctx, kerr.InvalidRecord); !errors.Is(got, context.Canceled) {
		t.Errorf("canceled: %v", got)
	}
}
