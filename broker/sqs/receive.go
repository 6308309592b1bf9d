package sqs

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxd/outbox/broker"
)

// ReceiveAttributeNames and ReceiveSystemAttributeNames are what a consumer asks
// ReceiveMessage for, so Decode has all it needs.
var (
	ReceiveAttributeNames       = []string{"All"}
	ReceiveSystemAttributeNames = []types.MessageSystemAttributeName{
		types.MessageSystemAttributeNameMessageGroupId, types.MessageSystemAttributeNameMessageDeduplicationId,
		types.MessageSystemAttributeNameApproximateReceiveCount,
	}
)

// Received is a message as a consumer reads it back, the publisher's encodings
// undone.
type Received struct {
	// ID is the event id (the id header).
	ID string
	// Key is the message group id on a FIFO queue (the aggregate id, unless the
	// publisher had to hash it), else the aggregate id header.
	Key string
	// Headers are every header the publisher sent, wire-format ones included.
	Headers map[string]string
	// Payload is the event payload; PayloadNull marks a NULL one.
	Payload     []byte
	PayloadNull bool
}

// Decode reads a received message. It fails only for a message this publisher did
// not write (a packed header attribute that is not JSON, a base64 body that is not
// base64).
func Decode(m types.Message) (*Received, error) {
	r := &Received{Headers: map[string]string{}}
	encoding := ""
	for k, v := range m.MessageAttributes {
		if v.StringValue == nil {
			continue
		}
		switch k {
		case HeaderPacked:
			var packed map[string]string
			if err := json.Unmarshal([]byte(*v.StringValue), &packed); err != nil {
				return nil, fmt.Errorf("sqs: attribute %s: %w", HeaderPacked, err)
			}
			for hk, hv := range packed {
				r.Headers[hk] = hv
			}
		case HeaderBodyEncoding:
			encoding = *v.StringValue
		default:
			r.Headers[k] = *v.StringValue
		}
	}
	body := ""
	if m.Body != nil {
		body = *m.Body
	}
	switch encoding {
	case "":
		r.Payload = []byte(body)
	case "empty":
		r.Payload = []byte{}
	case "base64":
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("sqs: base64 body: %w", err)
		}
		r.Payload = b
	default:
		return nil, fmt.Errorf("sqs: unknown body encoding %q", encoding)
	}
	r.PayloadNull = r.Headers[broker.HeaderPayloadNull] == "true"
	r.ID = r.Headers[broker.HeaderID]
	r.Key = m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
	if r.Key == "" || strings.HasPrefix(r.Key, "sha256-") {
		r.Key = r.Headers[broker.HeaderAggregateID]
	}
	return r, nil
}

// DecodeMessage is Decode for a caller that wants the message as the publisher was
// given it. Topic is left empty: the caller knows the queue it read.
func DecodeMessage(m types.Message) (broker.Message, error) {
	r, err := Decode(m)
	if err != nil {
		return broker.Message{}, err
	}
	return broker.Message{ID: r.ID, Key: r.Key, Payload: r.Payload, PayloadNull: r.PayloadNull, Headers: r.Headers}, nil
}
