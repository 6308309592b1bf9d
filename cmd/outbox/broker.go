package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/amqp"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/internal/redact"
	"github.com/outboxd/outbox/outboxdriver"
)

// brokerOptions are the publisher settings from flags.
type brokerOptions struct {
	natsCreateStream bool
	webhookSecret    string
	maxMessageBytes  int
	amqpExchange     string
	redisMaxLen      int64
	kafkaCompression string
	// Relay only: exactly-once into Kafka (kafka.TxPublisher).
	kafkaTransactionalID, kafkaProgressTopic string

	webhookSecretFile, webhookCA, webhookCert, webhookKey string
	webhookAllowHTTP                                      bool

	logger *slog.Logger // for a publisher's own warnings (SQS standard queues)
}

const brokerSchemes = "nats://, kafka://, amqp://, redis://, mqtt://, pubsub://PROJECT, sqs://REGION, http(s):// (webhook) or stdout:"

// brokerScheme returns the --broker URL's scheme, or a usage error for a URL the
// relay cannot use, before anything connects.
func brokerScheme(rawURL string, o brokerOptions) (string, error) {
	if rawURL == "" {
		return "", usageErr("--broker is required: %s", brokerSchemes)
	}
	if _, err := kafka.Compression(o.kafkaCompression); err != nil {
		return "", usageErr("--kafka-compression: %v", err)
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	k, ok := kindOf(scheme)
	if !ok {
		return "", usageErr("--broker %q: unknown scheme (want %s)", redact.Endpoint(rawURL), brokerSchemes)
	}
	if k.check != nil {
		if err := k.check(scheme, rawURL, o); err != nil {
			return "", err
		}
	}
	return scheme, nil
}

// checkWebhook refuses a webhook without its secret, plain http:// off loopback
// without --webhook-allow-http, and half a client certificate.
func checkWebhook(scheme, rawURL string, o brokerOptions) error {
	if o.webhookSecret == "" && o.webhookSecretFile == "" {
		return usageErr("--broker %s: a webhook needs --webhook-secret-file (or --webhook-secret, OUTBOX_WEBHOOK_SECRET_FILE)", scheme)
	}
	if scheme == "http" && !o.webhookAllowHTTP && !loopbackURL(rawURL) {
		return usageErr("--broker %s: plain http:// to a host that is not loopback sends every event readable on the wire; use https:// or --webhook-allow-http", redact.String(rawURL))
	}
	if (o.webhookCert == "") != (o.webhookKey == "") {
		return usageErr("--webhook-cert and --webhook-key go together")
	}
	return nil
}

// defaultTopicTemplate is the topic template for a broker when none is given: MQTT
// topics use '/' between levels, SQS queue names no dots (but .fifo).
func defaultTopicTemplate(scheme string) string {
	if k, ok := kindOf(scheme); ok && k.topic != "" {
		return k.topic
	}
	return broker.TopicTemplateDefault
}

// brokerFlags registers the flags that configure a publisher (relay and replay).
func brokerFlags(fs *flag.FlagSet) *brokerOptions {
	var bo brokerOptions
	fs.BoolVar(&bo.natsCreateStream, "nats-create-stream", false, "NATS: create the JetStream stream OUTBOX over outbox.event.> when no stream covers a subject")
	fs.StringVar(&bo.webhookSecret, "webhook-secret", "", "webhook: the signing secret (whsec_<base64> or raw); prefer --webhook-secret-file")
	fs.StringVar(&bo.webhookSecretFile, "webhook-secret-file", "", "webhook: a file holding the signing secret (kept out of ps and the environment)")
	fs.StringVar(&bo.webhookCA, "webhook-ca", "", "webhook: PEM file of the CAs that sign the endpoint's certificate (default: the system's)")
	fs.StringVar(&bo.webhookCert, "webhook-cert", "", "webhook: PEM client certificate for mutual TLS (with --webhook-key)")
	fs.StringVar(&bo.webhookKey, "webhook-key", "", "webhook: PEM private key of --webhook-cert")
	fs.BoolVar(&bo.webhookAllowHTTP, "webhook-allow-http", false, "webhook: allow plain http:// to a host that is not loopback (signed, but readable on the wire)")
	fs.IntVar(&bo.maxMessageBytes, "max-message-bytes", 0, "refuse larger messages before sending them (default: the publisher's own limit)")
	fs.StringVar(&bo.amqpExchange, "amqp-exchange", amqp.ExchangeDefault, "RabbitMQ: the topic exchange")
	fs.Int64Var(&bo.redisMaxLen, "redis-maxlen", 0, "Redis: trim each stream to about this many entries (0: no trimming)")
	fs.StringVar(&bo.kafkaCompression, "kafka-compression", "none", "Kafka: compress produced batches with "+kafka.Compressions+" (none, as Kafka Connect: every consumer can read it)")
	return &bo
}

// check refuses a bound that cannot be: --max-message-bytes has no off (the
// publisher's own limit is the default: leave the flag out), and --redis-maxlen's 0
// is no trimming.
func (o *brokerOptions) check(fs *flag.FlagSet) error {
	switch {
	case o.maxMessageBytes < 0 || o.maxMessageBytes == 0 && flagSet(fs, "max-message-bytes"):
		return usageErr("--max-message-bytes %d: want a size (leave it out for the publisher's own limit)", o.maxMessageBytes)
	case o.redisMaxLen < 0:
		return usageErr("--redis-maxlen %d: want a length, or 0 for no trimming", o.redisMaxLen)
	}
	return nil
}

// outsideTransactions is o without exactly-once: the options of the publisher that
// sends the dashboard's replays, which belong to no relay's transactions or progress.
func (o brokerOptions) outsideTransactions() brokerOptions {
	o.kafkaTransactionalID = ""
	return o
}

// forTable is o with the transactional id of one table of a --tables relay: the
// prefix given, then the table's name (each table is a unit of its own to fence).
func (o brokerOptions) forTable(t outboxdriver.Table) brokerOptions {
	if o.kafkaTransactionalID != "" {
		o.kafkaTransactionalID += "." + t.String()
	}
	return o
}

// cloudEventsBinding is the CloudEvents protocol binding of a broker scheme.
func cloudEventsBinding(scheme string) cloudevents.Binding {
	if k, ok := kindOf(scheme); ok {
		return k.binding
	}
	return cloudevents.Stdout
}

// openBroker connects the publisher for a --broker URL.
func openBroker(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
	scheme, err := brokerScheme(rawURL, o)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	k, _ := kindOf(scheme)
	return k.dial(ctx, rawURL, o)
}

// startBroker opens the relay's publisher. A broker that does not answer at start
// is no reason to exit (under a supervisor that is a crash loop for as long as the
// broker is away): the relay starts with a publisher that dials on use
// (broker.Lazy), backs off as in an outage mid-run, and is not ready until the
// broker answers. A bad setting still ends the command at once.
func startBroker(ctx context.Context, rawURL string, o brokerOptions, log *slog.Logger) (broker.Publisher, error) {
	pub, err := openBroker(ctx, rawURL, o)
	if err == nil || !unreachable(err) || ctx.Err() != nil {
		return pub, err
	}
	scheme, _ := brokerScheme(rawURL, o)
	log.Warn("relay: the broker does not answer; starting anyway, publishing once it does (not ready until then)",
		"broker", redact.Endpoint(rawURL), "err", redact.String(err.Error()))
	return broker.NewLazy(func(ctx context.Context) (broker.Publisher, error) { return openBroker(ctx, rawURL, o) }, brokerTopics(scheme)), nil
}

// unreachable reports whether a dial failed for want of an answer (refused, timed
// out, no server up), not for a setting no retry can fix.
func unreachable(err error) bool {
	var opErr *net.OpError
	return errors.Is(err, broker.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, natsgo.ErrNoServers) || errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &opErr)
}

// brokerTopics are a scheme's topic rules, known without a connection.
func brokerTopics(scheme string) broker.Topics {
	if k, ok := kindOf(scheme); ok {
		return k.topics
	}
	return broker.Topics{}
}

// openWebhook builds the webhook publisher: the secret from its file when given, and
// an HTTP client with the CAs and client certificate asked for.
func openWebhook(ctx context.Context, rawURL string, o brokerOptions) (broker.Publisher, error) {
	secret := o.webhookSecret
	if o.webhookSecretFile != "" {
		s, err := readSecretFile(o.webhookSecretFile, func(msg string) {
			if o.logger != nil {
				o.logger.Warn("--webhook-secret-file: " + msg)
			}
		})
		if err != nil {
			return nil, usageErr("--webhook-secret-file: %v", err)
		}
		secret = s
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.webhookCA != "" {
		pem, err := os.ReadFile(o.webhookCA)
		if err != nil {
			return nil, usageErr("--webhook-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageErr("--webhook-ca %s: no PEM certificate in it", o.webhookCA)
		}
		tc.RootCAs = pool
	}
	if o.webhookCert != "" {
		cert, err := tls.LoadX509KeyPair(o.webhookCert, o.webhookKey)
		if err != nil {
			return nil, usageErr("--webhook-cert/--webhook-key: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	client := &http.Client{Timeout: webhook.TimeoutDefault, Transport: tr}
	return webhook.Dial(ctx, rawURL, &webhook.Config{Secret: secret, MaxMessageBytes: o.maxMessageBytes, Client: client})
}

// loopbackURL reports whether rawURL's host is a loopback address or localhost.
func loopbackURL(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	return loopbackHost(u.Hostname())
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// plaintextWarnings says which connections may travel unencrypted or unverified to a
// host that is not loopback: pgx's default sslmode=prefer falls back to plaintext
// without a word, and verifies no certificate. docs/security.md has each component's
// TLS options.
func plaintextWarnings(dsn, brokerURL string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && !loopbackHost(u.Hostname()) && u.Hostname() != "" {
		q := u.Query()
		switch u.Scheme {
		case "postgres", "postgresql":
			if m := q.Get("sslmode"); m != "verify-full" && m != "verify-ca" {
				out = append(out, "the database connection is not verified TLS (sslmode="+map[bool]string{true: "prefer", false: m}[m == ""]+
					"): a network attacker can read or change it; use sslmode=verify-full")
			}
		case "mysql":
			if t := q.Get("tls"); t == "" || t == "false" || t == "skip-verify" || t == "preferred" {
				out = append(out, "the database connection is not verified TLS: use tls=true (or a registered TLS config)")
			}
		}
	}
	if u, err := url.Parse(brokerURL); err == nil && u.Hostname() != "" && !loopbackURL(brokerURL) {
		if k, ok := kindOf(u.Scheme); (!ok || !slices.Contains(k.tls, u.Scheme)) && u.Query().Get("tls") != "true" {
			out = append(out, "the broker connection ("+u.Scheme+"://) is not TLS: events and credentials travel readable; use its TLS scheme (docs/security.md)")
		}
	}
	return out
}
