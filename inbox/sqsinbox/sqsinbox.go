// Package sqsinbox consumes outbox events from an Amazon SQS queue through an inbox:
// each message is handled once in the consumer's transaction and deleted only after
// that transaction committed. A failing message is made invisible for a growing
// pause (ChangeMessageVisibility) and comes again; on a FIFO queue its group's later
// messages wait for it (SQS delivers none of a group while one is in flight, and the
// consumer leaves alone those it already received). A permanent failure, or a
// message the relay did not write, is logged and deleted (skipped).
package sqsinbox

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	sqspub "github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/inbox"
)

// Message reads the relay's wire format from an SQS message: the attributes (or the
// packed headers) are the headers, the body the payload, encodings undone; the
// message group is the aggregate id when no header says it.
func Message(m types.Message) (inbox.Message, error) {
	d, err := sqspub.Decode(m)
	if err != nil {
		return inbox.Message{}, err
	}
	msg := inbox.FromHeaders(d.Headers, d.Payload)
	if msg.AggregateID == "" {
		msg.AggregateID = d.Key
	}
	return msg, nil
}

// Consume long-polls the queue at queueURL until ctx ends (then it returns nil). fn
// runs in the inbox's transaction, only on first delivery. opts may be nil.
func Consume[TTx any](ctx context.Context, c *awssqs.Client, queueURL string, ib *inbox.Inbox[TTx], name string,
	fn func(ctx context.Context, tx TTx, m *inbox.Message) error, opts *inbox.ConsumeOptions) error {
	retry := inbox.NewRetrier(opts)
	log := slog.Default()
	if opts != nil && opts.Logger != nil {
		log = opts.Logger
	}
	q := aws.String(queueURL)
	for ctx.Err() == nil {
		out, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: q, MaxNumberOfMessages: 10, WaitTimeSeconds: 10,
			MessageAttributeNames: sqspub.ReceiveAttributeNames, MessageSystemAttributeNames: sqspub.ReceiveSystemAttributeNames})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		waiting := map[string]time.Duration{} // groups with a failed message in this receive
		for _, sm := range out.Messages {
			group := sm.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
			if wait, ok := waiting[group]; ok && group != "" {
				hide(ctx, c, q, sm, wait) // after its group's failed message, in order
				continue
			}
			m, err := Message(sm)
			if err != nil {
				log.Error("sqsinbox: a message the relay did not write; deleted", "consumer", name, "message_id", aws.ToString(sm.MessageId), "err", err)
				if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: sm.ReceiptHandle}); err != nil && ctx.Err() == nil {
					return err
				}
				continue
			}
			if _, err := ib.Handle(ctx, name, &m, func(ctx context.Context, tx TTx) error { return fn(ctx, tx, &m) }); err != nil {
				attempt, _ := strconv.Atoi(sm.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
				wait, permanent := retry.Failed(name, &m, max(attempt, 1), err)
				if !permanent {
					waiting[group] = wait
					hide(ctx, c, q, sm, wait)
					continue
				}
			}
			if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: sm.ReceiptHandle}); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err // handled and committed: the inbox recognises it when it comes again
			}
		}
	}
	return nil
}

// hide makes a received message come again after wait (SQS counts whole seconds).
func hide(ctx context.Context, c *awssqs.Client, q *string, m types.Message, wait time.Duration) {
	secs := int32(min(math.Ceil(wait.Seconds()), 12*3600))
	_, _ = c.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: q, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: secs})
}
