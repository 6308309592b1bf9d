package main

import (
	"context"
	"os"
	"slices"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/mqtt"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/pubsub"
	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/broker/sqs"
	"github.com/outboxd/outbox/broker/stdout"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/redact"
)

// brokerKind is what the CLI knows of one broker, so that adding a broker is adding
// one entry to brokerKinds: its URL schemes, its default topic template, its topics'
// rules, its CloudEvents binding, how its publisher is dialed and how verify reads
// it back.
type brokerKind struct {
	schemes []string
	// tls are the schemes whose connections are TLS (no plaintext warning).
	tls []string
	// topic is the default topic template ("": broker.TopicTemplateDefault).
	topic   string
	topics  broker.Topics
	binding cloudevents.Binding
	// check refuses settings the broker cannot work with, before anything connects.
	check func(scheme, rawURL string, o brokerOptions) error
	dial  func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error)
	// verify subscribes where the canaries go, for the schemes in verifies (none:
	// verify cannot read this broker back).
	verifies []string
	verify   func(ctx context.Context, rawURL, subject string, v verifyOptions) (verifyReader, error)
}

// verifyOptions are verify's settings that some brokers' readers need.
type verifyOptions struct {
	amqpExchange, webhookListen, webhookSecret string
}

var brokerKinds = []brokerKind{
	{
		schemes: []string{"nats", "tls"}, tls: []string{"tls"},
		topics: broker.Topics{Escape: nats.EscapeToken, Validate: nats.ValidateSubject}, binding: cloudevents.NATS,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			return nats.Dial(ctx, rawURL, &nats.Config{CreateStream: o.natsCreateStream})
		},
		verifies: []string{"nats"},
		verify: func(ctx context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return natsVerifyReader(ctx, rawURL, subject)
		},
	},
	{
		schemes: []string{"kafka", "kafkas"}, tls: []string{"kafkas"},
		topics: broker.Topics{Validate: kafka.ValidateTopic}, binding: cloudevents.Kafka,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			compression, err := kafka.Compression(o.kafkaCompression)
			if err != nil {
				return nil, usageErr("--kafka-compression: %v", err)
			}
			cfg := kafka.Config{MaxMessageBytes: o.maxMessageBytes}
			if o.kafkaTransactionalID != "" {
				return kafka.DialTransactional(rawURL, &kafka.TxConfig{Config: cfg, TransactionalID: o.kafkaTransactionalID,
					ProgressTopic: o.kafkaProgressTopic}, compression)
			}
			return kafka.Dial(ctx, rawURL, &cfg, compression)
		},
		verifies: []string{"kafka", "kafkas"},
		verify: func(_ context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return kafkaVerifyReader(rawURL, subject)
		},
	},
	{
		schemes: []string{"amqp", "amqps"}, tls: []string{"amqps"},
		topics: broker.Topics{Validate: amqp.ValidateTopic}, binding: cloudevents.AMQP,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			return amqp.Dial(ctx, rawURL, &amqp.Config{Exchange: o.amqpExchange, MaxMessageBytes: o.maxMessageBytes})
		},
		verifies: []string{"amqp", "amqps"},
		verify: func(_ context.Context, rawURL, subject string, v verifyOptions) (verifyReader, error) {
			return amqpVerifyReader(rawURL, v.amqpExchange, subject)
		},
	},
	{
		schemes: []string{"redis", "rediss"}, tls: []string{"rediss"},
		binding: cloudevents.Redis,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			return redis.Dial(ctx, rawURL, &redis.Config{MaxLen: o.redisMaxLen, MaxMessageBytes: o.maxMessageBytes})
		},
		verifies: []string{"redis", "rediss"},
		verify: func(ctx context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return redisVerifyReader(ctx, rawURL, subject)
		},
	},
	{
		// MQTT topics use '/' between levels.
		schemes: []string{"mqtt", "mqtts"}, tls: []string{"mqtts"}, topic: mqtt.TopicTemplateDefault,
		topics: broker.Topics{Escape: mqtt.EscapeToken, Validate: mqtt.ValidateTopic}, binding: cloudevents.MQTT,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			return mqtt.Dial(ctx, rawURL, &mqtt.Config{MaxMessageBytes: o.maxMessageBytes})
		},
		verifies: []string{"mqtt"},
		verify: func(ctx context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return mqttVerifyReader(ctx, rawURL, subject)
		},
	},
	{
		// Google's client speaks TLS to Pub/Sub (plain only to an emulator).
		schemes: []string{"pubsub"}, tls: []string{"pubsub"},
		topics: broker.Topics{Validate: pubsub.ValidateTopic}, binding: cloudevents.PubSub,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			// Credentials as Google's client libraries find them; PUBSUB_EMULATOR_HOST
			// points the client at an emulator.
			return pubsub.Dial(ctx, rawURL, &pubsub.Config{MaxMessageBytes: o.maxMessageBytes})
		},
		verifies: []string{"pubsub"},
		verify: func(ctx context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return pubsubVerifyReader(ctx, rawURL, subject)
		},
	},
	{
		// SQS queue names have no dots (but .fifo).
		schemes: []string{"sqs"}, tls: []string{"sqs"}, topic: sqs.TopicTemplateDefault,
		topics: broker.Topics{Escape: sqs.EscapeToken, Validate: sqs.ValidateTopic}, binding: cloudevents.SQS,
		dial: func(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
			// Credentials from AWS's default chain; ?endpoint= for an emulator.
			return sqs.Dial(ctx, rawURL, &sqs.Config{MaxMessageBytes: o.maxMessageBytes, Logger: o.logger})
		},
		verifies: []string{"sqs"},
		verify: func(ctx context.Context, rawURL, subject string, _ verifyOptions) (verifyReader, error) {
			return sqsVerifyReader(ctx, rawURL, subject)
		},
	},
	{
		schemes: []string{"http", "https"}, tls: []string{"https"}, binding: cloudevents.HTTP,
		check: checkWebhook, dial: openWebhook,
		verifies: []string{"http", "https"},
		verify: func(ctx context.Context, rawURL, _ string, v verifyOptions) (verifyReader, error) {
			if v.webhookListen == "" || v.webhookSecret == "" {
				return nil, usageErr("--broker %s: a webhook is read back by verify itself: give --webhook-listen (where the relay posts) and --webhook-secret", redact.Endpoint(rawURL))
			}
			return webhookVerifyReader(ctx, v.webhookListen, v.webhookSecret)
		},
	},
	{
		schemes: []string{"stdout"}, binding: cloudevents.Stdout,
		dial: func(context.Context, string, brokerOptions) (broker.Publisher, error) {
			return stdout.New(os.Stdout), nil
		},
	},
}

// kindOf returns the broker of a --broker URL's scheme.
func kindOf(scheme string) (*brokerKind, bool) {
	for i := range brokerKinds {
		if slices.Contains(brokerKinds[i].schemes, scheme) {
			return &brokerKinds[i], true
		}
	}
	return nil, false
}
