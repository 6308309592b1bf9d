package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// Canary events: an aggregate type of their own, so consumers can skip them.
const (
	verifyAggregateType = "outbox_verify"
	verifyEventType     = "outbox.verify"
)

// runVerify checks a deployment end to end: it writes canary events through the
// real writer, reads them back from the broker, and reports what arrived.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &verifyFlags{}
	fs := newFlags("verify", stderr)
	o.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	table, subject, kind, err := o.validate()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, o.deadline+10*time.Second)
	defer cancel()
	// Subscribe first: a canary published before the reader starts would be missed.
	reader, err := kind.verify(rctx, o.broker, subject, o.reader)
	if err != nil {
		return err
	}
	defer reader.close()
	sent, err := o.writeCanaries(rctx, table)
	if err != nil {
		return err
	}
	got, err := o.readBack(rctx, reader, sent)
	if err != nil {
		return err
	}
	rep := analyzeVerify(sent, got)
	fmt.Fprintf(stdout, "verify: %d canary events over %d aggregates on %s (table %s)\n", len(sent), o.aggregates, subject, table)
	fmt.Fprint(stdout, rep.String())
	fmt.Fprintf(stdout, "The canaries stay in %s as any published event does (aggregate type %s): the relay's cleanup removes them after its retention.\n",
		table, verifyAggregateType)
	if !rep.ok() {
		return fmt.Errorf("verify failed: %s", rep.summary())
	}
	return nil
}

// verifyFlags are verify's flags.
type verifyFlags struct {
	dsn, table         *string
	broker, topic      string
	reader             verifyOptions
	events, aggregates int
	deadline           time.Duration
}

func (o *verifyFlags) register(fs *flag.FlagSet) {
	o.dsn, o.table = dbTableFlags(fs, "database URL: postgres://user@host:5432/db")
	fs.StringVar(&o.broker, "broker", "", "the broker the relay publishes to: nats://, kafka://, redis://, amqp:// or mqtt://...")
	fs.StringVar(&o.reader.amqpExchange, "amqp-exchange", amqp.ExchangeDefault, "RabbitMQ: the relay's topic exchange")
	fs.StringVar(&o.reader.webhookListen, "webhook-listen", "", "webhooks: the address verify receives on, the relay's --broker URL pointing there (e.g. 127.0.0.1:8088)")
	fs.StringVar(&o.reader.webhookSecret, "webhook-secret", "", "webhooks: the relay's signing secret, to check each request's signature")
	fs.StringVar(&o.topic, "topic-template", "", "the relay's --topic-template (default: the relay's default for the broker)")
	fs.IntVar(&o.events, "events", 100, "canary events to write")
	fs.IntVar(&o.aggregates, "aggregates", 10, "aggregates they are spread over (order is checked per aggregate)")
	fs.DurationVar(&o.deadline, "deadline", 30*time.Second, "how long to wait for every event to arrive")
}

// validate checks the flags and returns the table, the subject the canaries go to
// and the broker's kind (which reads them back).
func (o *verifyFlags) validate() (outboxdriver.Table, string, *brokerKind, error) {
	if o.events < 1 || o.aggregates < 1 || o.aggregates > o.events {
		return outboxdriver.Table{}, "", nil, usageErr("--events must be positive and --aggregates 1..--events")
	}
	scheme, _, _ := strings.Cut(o.broker, "://")
	if o.topic == "" {
		o.topic = defaultTopicTemplate(scheme)
	}
	tmpl, err := broker.ParseTemplate(o.topic)
	if err != nil {
		return outboxdriver.Table{}, "", nil, usageErr("--topic-template: %v", err)
	}
	// The fields placed as the relay's publisher escapes them (brokerTopics: one
	// rule per scheme, nats:// and tls:// alike).
	subject := tmpl.Execute(broker.TopicFields{AggregateType: verifyAggregateType, Type: verifyEventType}, brokerTopics(scheme).Escape)
	table, err := parseTable(*o.table, string(outboxdriver.PayloadJSON))
	if err != nil {
		return outboxdriver.Table{}, "", nil, err
	}
	if s, _, _ := strings.Cut(*o.dsn, "://"); s != "postgres" && s != "postgresql" {
		return outboxdriver.Table{}, "", nil, usageErr("--db: verify writes through the PostgreSQL writer (postgres://...)")
	}
	k, ok := kindOf(scheme)
	if !ok || !slices.Contains(k.verifies, scheme) {
		return outboxdriver.Table{}, "", nil, usageErr("--broker %s: verify reads back from nats://, kafka://, redis://, amqp://, mqtt://, pubsub://, sqs:// and http(s):// (webhooks)", redact.Endpoint(o.broker))
	}
	return table, subject, k, nil
}

// writeCanaries writes the canary events, each in a transaction of its own.
func (o *verifyFlags) writeCanaries(ctx context.Context, table outboxdriver.Table) ([]verifySent, error) {
	pool, err := pgxpool.New(ctx, *o.dsn)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", redact.URL(*o.dsn), err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), nil)
	if err != nil {
		return nil, err
	}
	run := uuid.NewString()[:8]
	sent := make([]verifySent, 0, o.events)
	for i := 0; i < o.events; i++ {
		ev := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: verifyAggregateType,
			AggregateID: fmt.Sprintf("verify-%s-%d", run, i%o.aggregates), Type: verifyEventType,
			Payload: []byte(fmt.Sprintf(`{"run":%q,"n":%d}`, run, i))}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, ev) }); err != nil {
			return nil, fmt.Errorf("write canary %d: %w", i, err)
		}
		sent = append(sent, verifySent{id: ev.ID, aggregate: ev.AggregateID, committed: time.Now()})
	}
	return sent, nil
}

// readBack reads the canaries back until each came or the deadline passed.
func (o *verifyFlags) readBack(ctx context.Context, reader verifyReader, sent []verifySent) ([]verifyArrival, error) {
	want := make(map[string]bool, len(sent))
	for _, s := range sent {
		want[s.id] = true
	}
	var got []verifyArrival
	seen := map[string]bool{}
	until := time.Now().Add(o.deadline)
	for len(seen) < len(sent) && time.Now().Before(until) {
		batch, err := reader.next(ctx, time.Until(until))
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("read back from %s: %w", redact.Endpoint(o.broker), err)
		}
		for _, a := range batch {
			if want[a.id] {
				got = append(got, a)
				seen[a.id] = true
			}
		}
	}
	return got, nil
}

type verifySent struct {
	id, aggregate string
	committed     time.Time
}

type verifyArrival struct {
	id      string
	arrived time.Time
}

// verifyReport is what a verify run found.
type verifyReport struct {
	sent, delivered, lost, duplicated, outOfOrder int
	p50, p99                                      time.Duration
}

func (r verifyReport) ok() bool {
	return r.lost == 0 && r.duplicated == 0 && r.outOfOrder == 0 && r.delivered == r.sent
}

func (r verifyReport) summary() string {
	return fmt.Sprintf("%d of %d delivered, %d lost, %d duplicated, %d out of order", r.delivered, r.sent, r.lost, r.duplicated, r.outOfOrder)
}

func (r verifyReport) String() string {
	verdict := "OK"
	if !r.ok() {
		verdict = "FAILED"
	}
	return fmt.Sprintf("  delivered    %d of %d\n  lost         %d\n  duplicated   %d\n  out of order %d\n  commit→broker p50 %v, p99 %v\n%s\n",
		r.delivered, r.sent, r.lost, r.duplicated, r.outOfOrder, r.p50.Round(time.Millisecond/10), r.p99.Round(time.Millisecond/10), verdict)
}

// analyzeVerify compares what was sent with what arrived, in arrival order: an event
// arriving before an earlier event of its aggregate is out of order.
func analyzeVerify(sent []verifySent, got []verifyArrival) verifyReport {
	r := verifyReport{sent: len(sent)}
	byID := make(map[string]int, len(sent))
	for i, s := range sent {
		byID[s.id] = i
	}
	count := map[string]int{}
	last := map[string]int{} // per aggregate: the write index of the latest arrival
	var lat []time.Duration
	for _, a := range got {
		i, ok := byID[a.id]
		if !ok {
			continue
		}
		count[a.id]++
		if count[a.id] > 1 {
			r.duplicated++
			continue
		}
		s := sent[i]
		if prev, ok := last[s.aggregate]; ok && i < prev {
			r.outOfOrder++
		} else {
			last[s.aggregate] = i
		}
		lat = append(lat, a.arrived.Sub(s.committed))
	}
	r.delivered = len(count)
	r.lost = r.sent - r.delivered
	if len(lat) > 0 {
		slices.Sort(lat)
		r.p50, r.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return r
}

// verifyReader reads what the broker holds on the canaries' topic.
type verifyReader interface {
	next(ctx context.Context, wait time.Duration) ([]verifyArrival, error)
	close()
}

// pushReader collects what a broker's client pushes to it, for next to take.
type pushReader struct {
	wake chan struct{}
	mu   sync.Mutex
	got  []verifyArrival // arrived, not yet taken by next
	stop func()
}

func newPushReader() *pushReader { return &pushReader{wake: make(chan struct{}, 1)} }

func (r *pushReader) add(id string) {
	r.mu.Lock()
	r.got = append(r.got, verifyArrival{id: id, arrived: time.Now()})
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *pushReader) next(ctx context.Context, wait time.Duration) ([]verifyArrival, error) {
	t := time.NewTimer(min(max(wait, time.Millisecond), time.Second))
	defer t.Stop()
	select {
	case <-r.wake:
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out, nil
}

func (r *pushReader) close() { r.stop() }

// natsVerifyReader reads the subject's new messages from the stream that holds it,
// with an ordered (ephemeral) consumer: nothing is left behind on the server. A
// subject no stream holds yet is not an error: a relay started with
// --nats-create-stream creates the stream on its first publish. The reader then
// attaches once the stream appears, from the moment verify started.
func natsVerifyReader(ctx context.Context, rawURL, subject string) (verifyReader, error) {
	since := time.Now()
	nc, err := nats.Connect(rawURL, nats.Name("outbox verify"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact.Endpoint(rawURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	r := newPushReader()
	var cc jetstream.ConsumeContext
	attach := func(ctx context.Context, stream string, policy jetstream.OrderedConsumerConfig) error {
		policy.FilterSubjects = []string{subject}
		cons, err := js.OrderedConsumer(ctx, stream, policy)
		if err == nil {
			cc, err = cons.Consume(func(m jetstream.Msg) { r.add(m.Headers().Get(broker.HeaderID)) })
		}
		return err
	}
	stream, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		if err := attach(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}); err != nil {
			nc.Close()
			return nil, err
		}
		r.stop = func() { cc.Stop(); nc.Close() }
		return r, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		nc.Close()
		return nil, fmt.Errorf("NATS: the stream for %s: %w", subject, err)
	}
	// No stream yet: wait for the relay to create it.
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			if stream, err := js.StreamNameBySubject(wctx, subject); err == nil {
				start := since
				if attach(wctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start}) == nil {
					return
				}
			}
			select {
			case <-wctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	r.stop = func() {
		stop()
		<-done
		if cc != nil {
			cc.Stop()
		}
		nc.Close()
	}
	return r, nil
}

// amqpVerifyReader binds a queue of its own (exclusive, deleted when verify ends) to
// the relay's exchange for the canaries' routing key.
func amqpVerifyReader(rawURL, exchange, routingKey string) (verifyReader, error) {
	conn, err := amqp091.Dial(rawURL)
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", redact.Endpoint(rawURL), err)
	}
	ch, err := conn.Channel()
	if err == nil {
		var q amqp091.Queue
		if q, err = ch.QueueDeclare("", false, true, true, false, nil); err == nil {
			if err = ch.QueueBind(q.Name, routingKey, exchange, false, nil); err == nil {
				var ds <-chan amqp091.Delivery
				if ds, err = ch.Consume(q.Name, "", true, true, false, false, nil); err == nil {
					r := newPushReader()
					go func() {
						for d := range ds {
							r.add(d.MessageId) // the AMQP publisher's message id is the event id
						}
					}()
					r.stop = func() { _ = conn.Close() }
					return r, nil
				}
			}
		}
	}
	_ = conn.Close()
	return nil, fmt.Errorf("RabbitMQ: a queue bound to exchange %q for %s: %w", exchange, routingKey, err)
}

// mqttVerifyReader subscribes to the canaries' topic at QoS 1 with a clean session.
func mqttVerifyReader(ctx context.Context, rawURL, topic string) (verifyReader, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, usageErr("--broker %s: want mqtt://host:1883", redact.Endpoint(rawURL))
	}
	addr := u.Host
	if u.Port() == "" {
		addr += ":1883"
	}
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect to MQTT at %s: %w", addr, err)
	}
	r := newPushReader()
	c := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			if pr.Packet.Properties != nil {
				r.add(pr.Packet.Properties.User.Get(broker.HeaderID))
			}
			return true, nil
		}}})
	cn := &paho.Connect{ClientID: "outbox-verify-" + uuid.NewString()[:8], CleanStart: true, KeepAlive: 30}
	if u.User != nil {
		cn.Username, cn.UsernameFlag = u.User.Username(), true
		if p, ok := u.User.Password(); ok {
			cn.Password, cn.PasswordFlag = []byte(p), true
		}
	}
	if _, err := c.Connect(ctx, cn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("connect to MQTT at %s: %w", addr, err)
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
		_ = c.Disconnect(&paho.Disconnect{})
		return nil, fmt.Errorf("MQTT subscribe %s: %w", topic, err)
	}
	r.stop = func() { _ = c.Disconnect(&paho.Disconnect{}); <-c.Done() }
	return r, nil
}

// kafkaVerifyReader reads the topic's records produced from now on (by timestamp, so
// none is missed while the client finds the topic), without a consumer group.
func kafkaVerifyReader(rawURL, topic string) (verifyReader, error) {
	conn, err := kafka.ConnectOptions(rawURL)
	if err != nil {
		return nil, usageErr("--broker: %v", err)
	}
	cl, err := kgo.NewClient(append(conn, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(time.Now().Add(-time.Second).UnixMilli())))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	r := newPushReader()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
				for _, h := range rec.Headers {
					if h.Key == broker.HeaderID {
						r.add(string(h.Value))
					}
				}
			})
		}
	}()
	r.stop = func() { cancel(); <-done; cl.Close() }
	return r, nil
}

// webhookVerifyReader is the webhook's receiver for the time of the check: it answers
// 2xx to every correctly signed request and records the canaries among them (the
// relay's --broker points at it; other events get 2xx too and are ignored).
func webhookVerifyReader(ctx context.Context, addr, secret string) (verifyReader, error) {
	key, err := webhook.DecodeSecret(secret)
	if err != nil {
		return nil, usageErr("--webhook-secret: %v", err)
	}
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--webhook-listen: %w", err)
	}
	r := newPushReader()
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 16<<20))
		if err == nil {
			err = webhook.Verify(key, req.Header, body, time.Now(), 5*time.Minute)
		}
		if err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		r.add(req.Header.Get(webhook.HeaderID))
		w.WriteHeader(http.StatusNoContent)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	r.stop = func() { _ = srv.Close(); <-done }
	return r, nil
}

// pubsubVerifyReader receives through a subscription of its own on the topic (message
// ordering on), deleted when verify ends. PUBSUB_EMULATOR_HOST reaches an emulator.
func pubsubVerifyReader(ctx context.Context, rawURL, topic string) (verifyReader, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, usageErr("--broker %s: want pubsub://PROJECT", redact.Endpoint(rawURL))
	}
	c, err := gpubsub.NewClient(ctx, u.Host)
	if err != nil {
		return nil, fmt.Errorf("connect to Pub/Sub (project %s): %w", u.Host, err)
	}
	name := "projects/" + u.Host + "/subscriptions/outbox-verify-" + uuid.NewString()[:8]
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: name,
		Topic: "projects/" + u.Host + "/topics/" + topic, EnableMessageOrdering: true}); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("Pub/Sub: a subscription on %s: %w", topic, err)
	}
	r := newPushReader()
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Subscriber(name).Receive(rctx, func(_ context.Context, m *gpubsub.Message) {
			r.add(m.Attributes[broker.HeaderID])
			m.Ack()
		})
	}()
	r.stop = func() {
		cancel()
		<-done
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		_ = c.SubscriptionAdminClient.DeleteSubscription(dctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: name})
		_ = c.Close()
	}
	return r, nil
}

type redisReader struct {
	c      *goredis.Client
	stream string
	last   string
}

// redisVerifyReader reads the stream's entries added from now on.
func redisVerifyReader(ctx context.Context, rawURL, stream string) (verifyReader, error) {
	opts, err := goredis.ParseURL(rawURL)
	if err != nil {
		return nil, usageErr("--broker %s: %v", redact.Endpoint(rawURL), err)
	}
	c := goredis.NewClient(opts)
	// Start after the stream's last entry now ("$" on every read would miss entries
	// added between two reads).
	last := "0-0"
	if es, err := c.XRevRangeN(ctx, stream, "+", "-", 1).Result(); err == nil && len(es) > 0 {
		last = es[0].ID
	} else if err != nil && !errors.Is(err, goredis.Nil) {
		_ = c.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w", opts.Addr, err)
	}
	return &redisReader{c: c, stream: stream, last: last}, nil
}

func (r *redisReader) next(ctx context.Context, wait time.Duration) ([]verifyArrival, error) {
	res, err := r.c.XRead(ctx, &goredis.XReadArgs{Streams: []string{r.stream, r.last}, Count: 1000, Block: min(max(wait, time.Millisecond), time.Second)}).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []verifyArrival
	for _, s := range res {
		for _, m := range s.Messages {
			r.last = m.ID
			id, _ := m.Values["id"].(string) // the Redis publisher's id field
			out = append(out, verifyArrival{id: id, arrived: time.Now()})
		}
	}
	return out, nil
}

func (r *redisReader) close() { _ = r.c.Close() }

type sqsReader struct {
	c    *awssqs.Client
	qurl *string
}

// sqsVerifyReader reads the canaries' queue (their aggregate type is verify's own,
// so the queue holds nothing else) and deletes what it read.
func sqsVerifyReader(ctx context.Context, rawURL, queue string) (verifyReader, error) {
	p, err := sqs.Dial(ctx, rawURL, nil)
	if err != nil {
		return nil, usageErr("--broker %s: %v", redact.Endpoint(rawURL), err)
	}
	c := p.Client()
	out, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: &queue})
	if err != nil {
		return nil, fmt.Errorf("SQS queue %s (the relay publishes verify's canaries there: create it): %w", queue, err)
	}
	return &sqsReader{c: c, qurl: out.QueueUrl}, nil
}

func (r *sqsReader) next(ctx context.Context, wait time.Duration) ([]verifyArrival, error) {
	out, err := r.c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: r.qurl, MaxNumberOfMessages: 10,
		WaitTimeSeconds:       int32(min(max(wait, time.Second), 5*time.Second) / time.Second),
		MessageAttributeNames: sqs.ReceiveAttributeNames, MessageSystemAttributeNames: sqs.ReceiveSystemAttributeNames})
	if err != nil {
		return nil, err
	}
	var arrived []verifyArrival
	for _, m := range out.Messages {
		d, err := sqs.Decode(m)
		if err != nil {
			return nil, err
		}
		arrived = append(arrived, verifyArrival{id: d.ID, arrived: time.Now()})
		if _, err := r.c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: r.qurl, ReceiptHandle: m.ReceiptHandle}); err != nil {
			return nil, err
		}
	}
	return arrived, nil
}

func (r *sqsReader) close() {}
