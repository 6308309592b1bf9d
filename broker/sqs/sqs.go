// Package sqs publishes to Amazon SQS. A topic is a queue name; on a FIFO queue
// (a name ending in .fifo) each message's MessageGroupId is its key (the aggregate
// id), so SQS keeps an aggregate's events in write order, and its
// MessageDeduplicationId is the event id, so SQS drops a repeat sent within its
// five-minute deduplication window (a key or id SQS would not take, such as one with
// spaces or over 128 characters, is sent as its SHA-256: the same for the same key). A standard queue keeps no order: the publisher
// works, and says so once.
//
// Messages go in SendMessageBatch calls of up to ten, each entry answered on its
// own. A batch holds at most one message per key, and a key's next message goes
// only after the previous one was acknowledged: an entry SQS refuses can never be
// overtaken by a later message of its key in the same batch. Batches of different
// keys are in flight together (Config.MaxInFlight).
//
// Headers travel as String message attributes when all of them fit SQS's rules
// (at most ten; names of letters, digits, - _ . not starting with AWS. or Amazon.;
// non-empty values); otherwise they travel together as JSON in the one attribute
// HeaderPacked. A payload SQS cannot carry as a body (bytes outside its character
// set, or empty) is sent base64-encoded, or as "-" for an empty one, and the
// attribute HeaderBodyEncoding says so. The inbox (inbox/sqsinbox) undoes both.
package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/outboxd/outbox/broker"
)

// Defaults and SQS's limits.
const (
	// MaxMessageBytesDefault is SQS's classic message limit (256 KiB). Queues made
	// since August 2025 take 1 MiB: raise it to the queue's MaximumMessageSize.
	MaxMessageBytesDefault = 256 << 10
	MaxInFlightDefault     = 8
	// TimeoutDefault bounds one SendMessageBatch call (queue lookup included).
	TimeoutDefault = 30 * time.Second
	// BatchEntries is the most entries SendMessageBatch takes.
	BatchEntries = 10
	// MaxAttributes is the most message attributes a message carries.
	MaxAttributes = 10
	// TopicTemplateDefault names one FIFO queue per aggregate type.
	TopicTemplateDefault = "outbox-event-${aggregatetype}.fifo"
)

// Attributes the publisher adds when a message needs them.
const (
	// HeaderPacked carries every header as one JSON object, when they do not fit
	// SQS's attribute rules one by one.
	HeaderPacked = "outbox-headers"
	// HeaderBodyEncoding is "base64" (the body is the payload in standard base64)
	// or "empty" (the payload is empty, the body a placeholder).
	HeaderBodyEncoding = "outbox-body-encoding"
)

// Config configures a Publisher. The zero value (or nil) gives the defaults.
type Config struct {
	// MaxMessageBytes refuses larger messages (body and attributes) before they are
	// sent. Default MaxMessageBytesDefault.
	MaxMessageBytes int
	// MaxInFlight is how many SendMessageBatch calls may be in flight at once.
	// Default MaxInFlightDefault.
	MaxInFlight int
	// Timeout bounds each SendMessageBatch call, its queue lookup included: an
	// endpoint that stops answering (a black hole) is unavailable after it, not a
	// publish that never returns. Default TimeoutDefault.
	Timeout time.Duration
	// CreateQueues creates a queue that does not exist (tests, an emulator); in
	// production queues are made by their owners, and a missing one defers its
	// events.
	CreateQueues bool
	// Logger is told once per standard (non-FIFO) queue that it keeps no order.
	Logger *slog.Logger
}

// Publisher publishes to SQS. Build it with New or Dial.
type Publisher struct {
	c   *sqs.Client
	cfg Config

	mu     sync.Mutex
	queues map[string]string // queue name -> URL, once found
}

var (
	_ broker.Publisher      = (*Publisher)(nil)
	_ broker.TopicValidator = (*Publisher)(nil)
	_ broker.TopicEscaper   = (*Publisher)(nil)
)

// New returns a publisher on a client the caller built.
func New(c *sqs.Client, cfg *Config) (*Publisher, error) {
	if c == nil {
		return nil, errors.New("sqs publisher: client is nil")
	}
	p := &Publisher{c: c, queues: map[string]string{}}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.MaxMessageBytes <= 0 {
		p.cfg.MaxMessageBytes = MaxMessageBytesDefault
	}
	if p.cfg.MaxInFlight <= 0 {
		p.cfg.MaxInFlight = MaxInFlightDefault
	}
	if p.cfg.Timeout <= 0 {
		p.cfg.Timeout = TimeoutDefault
	}
	if p.cfg.Logger == nil {
		p.cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return p, nil
}

// Dial builds a client for sqs://REGION (empty: the region AWS's configuration
// gives), with ?endpoint=URL for an emulator or a VPC endpoint. Credentials come
// from AWS's default chain (environment, shared files, the instance's role).
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Publisher, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "sqs" || u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("SQS URL %q: want sqs://REGION[?endpoint=URL]", rawURL)
	}
	var opts []func(*awsconfig.LoadOptions) error
	if u.Host != "" {
		opts = append(opts, awsconfig.WithRegion(u.Host))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("SQS: AWS configuration: %w", err)
	}
	if ac.Region == "" {
		return nil, fmt.Errorf("SQS URL %q: no region (name it, sqs://us-east-1, or set AWS_REGION)", rawURL)
	}
	endpoint := u.Query().Get("endpoint")
	if endpoint != "" {
		if e, err := url.Parse(endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return nil, fmt.Errorf("SQS URL: endpoint %q: want http(s)://HOST[:PORT]", endpoint)
		}
	}
	c := sqs.NewFromConfig(ac, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	return New(c, cfg)
}

// ValidateTopic implements broker.TopicValidator: a queue name is 1 to 80
// characters, letters, digits, - and _, with .fifo at the end of a FIFO queue's.
func (p *Publisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// ValidateTopic is the method without a publisher.
func ValidateTopic(topic string) error {
	if topic == "" || len(topic) > 80 {
		return fmt.Errorf("invalid SQS queue name %q: 1 to 80 characters", topic)
	}
	for i, c := range strings.TrimSuffix(topic, ".fifo") {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("invalid SQS queue name %q: %q at %d (only letters, digits, - and _, and .fifo at the end)", topic, c, i)
		}
	}
	return nil
}

// EscapeTopicToken implements broker.TopicEscaper: a value placed in a queue name
// keeps its letters, digits, - and _; any other byte becomes _XX (hex).
func (p *Publisher) EscapeTopicToken(s string) string { return EscapeToken(s) }

// EscapeToken is EscapeTopicToken without a publisher.
func EscapeToken(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}

func isFIFO(queue string) bool { return strings.HasSuffix(queue, ".fifo") }

// queueURL finds (or, with CreateQueues, makes) a queue. Its errors are never a
// message's: a missing queue defers its events, anything else is the connection's.
func (p *Publisher) queueURL(ctx context.Context, name string) (string, error) {
	p.mu.Lock()
	u, ok := p.queues[name]
	p.mu.Unlock()
	if ok {
		return u, nil
	}
	call, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	out, err := p.c.GetQueueUrl(call, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	var missing *types.QueueDoesNotExist
	if errors.As(err, &missing) && p.cfg.CreateQueues {
		in := &sqs.CreateQueueInput{QueueName: aws.String(name)}
		if isFIFO(name) {
			in.Attributes = map[string]string{"FifoQueue": "true"}
		}
		var created *sqs.CreateQueueOutput
		if created, err = p.c.CreateQueue(call, in); err == nil {
			out = &sqs.GetQueueUrlOutput{QueueUrl: created.QueueUrl}
		}
	}
	switch {
	case errors.As(err, &missing):
		return "", broker.Deferred(fmt.Errorf("SQS queue %s does not exist (create it): %w", name, err))
	case err != nil:
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", broker.Unavailable(fmt.Errorf("SQS queue %s: %w", name, err))
	}
	if !isFIFO(name) {
		p.cfg.Logger.Warn("sqs: a standard queue keeps no order and drops no duplicate; use a FIFO queue (.fifo) for order per aggregate", "queue", name)
	}
	p.mu.Lock()
	p.queues[name] = aws.ToString(out.QueueUrl)
	p.mu.Unlock()
	return aws.ToString(out.QueueUrl), nil
}

// forget drops a queue's URL (it was deleted: look it up again).
func (p *Publisher) forget(name string) {
	p.mu.Lock()
	delete(p.queues, name)
	p.mu.Unlock()
}

// entry is one message ready to send.
type entry struct {
	i     int // index in the batch given to Publish
	queue string
	req   types.SendMessageBatchRequestEntry
	size  int
}

// Publish implements broker.Publisher. It sends in rounds (broker.Sequence): each
// round takes the next message of every key, packs them queue by queue into batches
// of up to ten sent at once, and the next round starts when every answer of this one
// is in, so a key's messages never race each other.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	entries := make([]*entry, len(msgs))
	answers := make([]error, len(msgs))
	var round []*entry
	return broker.Sequence(ctx, msgs, broker.Schedule{Sequential: true}, broker.Sender{
		Prepare: func(ctx context.Context, i int) (err error) {
			entries[i], err = p.prepare(ctx, i, &msgs[i])
			return err
		},
		Send: func(_ context.Context, i int) (broker.Future, error) {
			round = append(round, entries[i])
			return answer{&answers[i]}, nil
		},
		Flush: func(ctx context.Context) error {
			batches := p.batches(round)
			round = round[:0]
			sem := make(chan struct{}, p.cfg.MaxInFlight)
			var wg sync.WaitGroup
			for _, b := range batches {
				wg.Add(1)
				sem <- struct{}{}
				go func(b []*entry) {
					defer wg.Done()
					defer func() { <-sem }()
					for j, err := range p.sendBatch(ctx, b) {
						answers[b[j].i] = err
					}
				}(b)
			}
			wg.Wait()
			return nil
		},
	})
}

// answer is a queued message's answer, known once its round was flushed.
type answer struct{ err *error }

// Wait implements broker.Future.
func (a answer) Wait(context.Context) error { return *a.err }

// prepare refuses what SQS could never take, finds the message's queue (a missing
// one defers it) and renders its batch entry.
func (p *Publisher) prepare(ctx context.Context, i int, m *broker.Message) (*entry, error) {
	if err := ValidateTopic(m.Topic); err != nil {
		return nil, broker.Permanent(err)
	}
	if _, err := p.queueURL(ctx, m.Topic); err != nil {
		return nil, err
	}
	e, err := p.entry(i, m)
	if err != nil {
		return nil, err
	}
	if p.cfg.MaxMessageBytes > 0 && e.size > p.cfg.MaxMessageBytes {
		return nil, broker.Permanent(fmt.Errorf("message of %d bytes exceeds the limit of %d", e.size, p.cfg.MaxMessageBytes))
	}
	return e, nil
}

// batches packs a round's entries, queue by queue, into batches of at most ten
// entries and MaxMessageBytes (SQS bounds a batch's total as it bounds a message).
func (p *Publisher) batches(round []*entry) [][]*entry {
	var out [][]*entry
	open := map[string]int{} // queue -> index in out of its open batch
	sizes := map[string]int{}
	for _, e := range round {
		j, ok := open[e.queue]
		if !ok || len(out[j]) == BatchEntries || sizes[e.queue]+e.size > p.cfg.MaxMessageBytes {
			out = append(out, nil)
			j = len(out) - 1
			open[e.queue], sizes[e.queue] = j, 0
		}
		out[j] = append(out[j], e)
		sizes[e.queue] += e.size
	}
	return out
}

// sendBatch sends one batch (one queue) and returns each entry's outcome.
func (p *Publisher) sendBatch(ctx context.Context, b []*entry) []error {
	errs := make([]error, len(b))
	queue := b[0].queue
	fail := func(err error) []error {
		for j := range errs {
			errs[j] = err
		}
		return errs
	}
	qurl, err := p.queueURL(ctx, queue)
	if err != nil {
		return fail(err)
	}
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(qurl), Entries: make([]types.SendMessageBatchRequestEntry, len(b))}
	for j, e := range b {
		in.Entries[j] = e.req
		in.Entries[j].Id = aws.String(strconv.Itoa(j))
	}
	// The call's own deadline; classify still asks the caller's ctx, so running out
	// of it is the endpoint's unavailability, not the caller's cancellation.
	call, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	out, err := p.c.SendMessageBatch(call, in)
	if err != nil {
		var missing *types.QueueDoesNotExist
		if errors.As(err, &missing) {
			p.forget(queue)
		}
		cerr := classify(ctx, err)
		if len(b) > 1 && !broker.IsUnavailable(cerr) && !broker.IsDeferred(cerr) && ctx.Err() == nil {
			// SQS refused the whole batch for something in it: send each entry
			// alone, so the refusal is charged to the message that caused it.
			for j, e := range b {
				errs[j] = p.sendBatch(ctx, []*entry{e})[0]
			}
			return errs
		}
		return fail(cerr)
	}
	answered := make([]bool, len(b))
	for _, s := range out.Successful {
		if j, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && j >= 0 && j < len(b) {
			answered[j] = true
		}
	}
	for _, f := range out.Failed {
		j, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || j < 0 || j >= len(b) {
			continue
		}
		answered[j] = true
		ferr := fmt.Errorf("SQS refused the message: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
		if f.SenderFault {
			ferr = broker.Permanent(ferr) // the message's own fault: sending it again cannot help
		}
		errs[j] = ferr
	}
	for j := range b {
		if !answered[j] {
			errs[j] = fmt.Errorf("SQS did not answer for the message in its batch")
		}
	}
	return errs
}

// classify maps a failed call to its class: a missing queue defers its events,
// throttling and everything else that is not a message's fault is the connection's.
func classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var missing *types.QueueDoesNotExist
	if errors.As(err, &missing) {
		return broker.Deferred(fmt.Errorf("SQS queue does not exist (create it): %w", err))
	}
	var tooLong *types.BatchRequestTooLong
	var invalid *types.InvalidMessageContents
	if errors.As(err, &tooLong) || errors.As(err, &invalid) {
		return fmt.Errorf("SQS refused the batch: %w", err) // retried, counting an attempt
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient && !strings.Contains(api.ErrorCode(), "Throttl") &&
		!strings.Contains(api.ErrorCode(), "AccessDenied") && !strings.Contains(api.ErrorCode(), "Signature") &&
		!strings.Contains(api.ErrorCode(), "Token") && !strings.Contains(api.ErrorCode(), "Credential") {
		return fmt.Errorf("SQS refused the batch: %w", err)
	}
	return broker.Unavailable(fmt.Errorf("SQS: %w", err))
}

// entry renders a message as a batch entry: body, attributes, and on a FIFO queue
// its group (the key) and dedup id (the event id). A message SQS could never take is
// the message's fault (permanent).
func (p *Publisher) entry(i int, m *broker.Message) (*entry, error) {
	e := &entry{i: i, queue: m.Topic}
	attrs := map[string]types.MessageAttributeValue{}
	str := func(k, v string) {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		e.size += len(k) + len("String") + len(v)
	}
	body := string(m.Payload)
	encoding := ""
	switch {
	case len(m.Payload) == 0:
		body, encoding = "-", "empty"
	case !validBody(m.Payload):
		body, encoding = base64.StdEncoding.EncodeToString(m.Payload), "base64"
	}
	e.size += len(body)
	headers := map[string]string{}
	var order []string
	fits := true
	m.EachHeader(func(k, v string) {
		headers[k] = v
		order = append(order, k)
		fits = fits && validAttribute(k, v)
	})
	slots := MaxAttributes
	if encoding != "" {
		slots--
	}
	if fits && len(order) <= slots {
		for _, k := range order {
			str(k, headers[k])
		}
	} else {
		packed, err := json.Marshal(headers)
		if err != nil || !utf8.Valid(packed) {
			return nil, broker.Permanent(fmt.Errorf("headers SQS cannot carry: %w", err))
		}
		str(HeaderPacked, string(packed))
	}
	if encoding != "" {
		str(HeaderBodyEncoding, encoding)
	}
	e.req = types.SendMessageBatchRequestEntry{MessageBody: aws.String(body), MessageAttributes: attrs}
	if isFIFO(m.Topic) {
		e.req.MessageGroupId, e.req.MessageDeduplicationId = aws.String(fifoID(m.Key)), aws.String(fifoID(m.DedupKey()))
	}
	return e, nil
}

// validBody says whether SQS takes b as a message body: UTF-8 of #x9 #xA #xD and
// #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to #x10FFFF.
func validBody(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !(r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF) {
			return false
		}
	}
	return true
}

// validAttribute says whether SQS takes a String attribute of that name and value.
func validAttribute(name, value string) bool {
	if name == "" || len(name) > 256 || value == "" || strings.Contains(name, "..") || name[0] == '.' || name[len(name)-1] == '.' {
		return false
	}
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon.") || name == HeaderPacked || name == HeaderBodyEncoding {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return validBody([]byte(value))
}

// fifoID is s as a message group or deduplication id: s itself when SQS takes it
// (1 to 128 characters of printable ASCII), else "sha256-" and its hash, the same
// for the same s, so a key with spaces, accents or 200 characters keeps its order.
func fifoID(s string) string {
	ok := s != "" && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 33 && s[i] <= 126
	}
	if ok && !strings.HasPrefix(s, "sha256-") {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// Client is the SQS client the publisher sends with.
func (p *Publisher) Client() *sqs.Client { return p.c }

// Features implements broker.Publisher. Dedup and order hold on FIFO queues only.
func (p *Publisher) Features() broker.Features {
	return broker.Features{BrokerDedup: true, PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// Close implements broker.Publisher; the SQS client holds nothing to close.
func (p *Publisher) Close() error { return nil }
