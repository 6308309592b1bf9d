package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/mqtt"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/redis"
	"github.com/outboxd/outbox/broker/stdout"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/internal/redact"
)

// brokerOptions are the publisher settings from flags.
type brokerOptions struct {
	natsCreateStream bool
	webhookSecret    string
	maxMessageBytes  int
	amqpExchange     string
	redisMaxLen      int64
}

const brokerSchemes = "nats://, kafka://, amqp://, redis://, mqtt://, http(s):// (webhook) or stdout:"

// brokerScheme returns the --broker URL's scheme, or a usage error for a URL the
// relay cannot use, before anything connects.
func brokerScheme(rawURL string, o brokerOptions) (string, error) {
	if rawURL == "" {
		return "", usageErr("--broker is required: %s", brokerSchemes)
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch scheme {
	case "nats", "tls", "kafka", "kafkas", "amqp", "amqps", "redis", "rediss", "mqtt", "mqtts", "stdout":
		return scheme, nil
	case "http", "https":
		if o.webhookSecret == "" {
			return "", usageErr("--broker %s: a webhook needs --webhook-secret (or OUTBOX_WEBHOOK_SECRET)", scheme)
		}
		return scheme, nil
	}
	return "", usageErr("--broker %q: unknown scheme (want %s)", redact.URL(rawURL), brokerSchemes)
}

// defaultTopicTemplate is the topic template for a broker when none is given: MQTT
// topics use '/' between levels.
func defaultTopicTemplate(scheme string) string {
	if scheme == "mqtt" || scheme == "mqtts" {
		return mqtt.TopicTemplateDefault
	}
	return broker.TopicTemplateDefault
}

// openBroker connects the publisher for a --broker URL.
func openBroker(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
	scheme, err := brokerScheme(rawURL, o)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	switch scheme {
	case "kafka", "kafkas":
		return kafka.Dial(ctx, rawURL, &kafka.Config{MaxMessageBytes: o.maxMessageBytes})
	case "amqp", "amqps":
		return amqp.New(ctx, amqp.Config{URL: rawURL, Exchange: o.amqpExchange, MaxMessageBytes: o.maxMessageBytes})
	case "redis", "rediss":
		return redis.Dial(ctx, rawURL, &redis.Config{MaxLen: o.redisMaxLen, MaxMessageBytes: o.maxMessageBytes})
	case "mqtt", "mqtts":
		return mqtt.New(ctx, mqtt.Config{URL: rawURL, MaxMessageBytes: o.maxMessageBytes})
	case "http", "https":
		return webhook.New(webhook.Config{URL: rawURL, Secret: o.webhookSecret, MaxMessageBytes: o.maxMessageBytes})
	case "stdout":
		return stdout.New(os.Stdout), nil
	}
	return nats.Dial(ctx, rawURL, &nats.Config{CreateStream: o.natsCreateStream})
}
