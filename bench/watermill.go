package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/internal/testenv"
)

// The Watermill SQL forwarder, set up as its documentation shows: producers publish
// inside their transaction through forwarder.Publisher over the SQL publisher
// (watermill-sql v4's PostgreSQL queue schema); a forwarder process reads that table
// and publishes to NATS JetStream (watermill-nats v2, message id tracked for dedup,
// as outbox's Nats-Msg-Id).

const wmForwarderTopic = "outbox"

// wmTuning is the forwarder's settings: the library's defaults, or tuned.
type wmTuning struct {
	batch       int  // PostgreSQLQueueSchema.SubscribeBatchSize (0: its default, 100)
	deleteOnAck bool // PostgreSQLQueueOffsetsAdapter.DeleteOnAck (default: mark acked)
	ackAsync    bool // JetStreamConfig.AckAsync (default: wait for each ack)
}

func wmSchema(schema string, t wmTuning) wmsql.PostgreSQLQueueSchema {
	return wmsql.PostgreSQLQueueSchema{GenerateMessagesTableName: func(topic string) string {
		return pgx.Identifier{schema, "watermill_" + topic}.Sanitize()
	}, SubscribeBatchSize: t.batch}
}

func wmOffsets(schema string, t wmTuning) wmsql.PostgreSQLQueueOffsetsAdapter {
	return wmsql.PostgreSQLQueueOffsetsAdapter{GenerateMessagesTableName: wmSchema(schema, t).GenerateMessagesTableName, DeleteOnAck: t.deleteOnAck}
}

// wmBacklog writes events through Watermill's forwarder publisher, perTx per
// transaction, into a schema of its own; it returns the schema and a drop func.
func wmBacklog(ctx context.Context, pool *pgxpool.Pool, events, perTx int, topic string) (string, func(), error) {
	schema := testenv.UniqueName("bench_wm_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	drop := func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }
	qs, err := wmSchema(schema, wmTuning{}).SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: wmForwarderTopic})
	if err != nil {
		drop()
		return "", nil, err
	}
	for _, q := range qs {
		if _, err := pool.Exec(ctx, q.Query, q.Args...); err != nil {
			drop()
			return "", nil, err
		}
	}
	logger := watermill.NopLogger{}
	for i := 0; i < events; i += perTx {
		msgs := make([]*message.Message, 0, perTx)
		for j := i; j < min(i+perTx, events); j++ {
			m := message.NewMessage(watermill.NewUUID(), payload(j))
			m.Metadata.Set("partition_key", fmt.Sprintf("customer-%04d", j%1000))
			msgs = append(msgs, m)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: wmSchema(schema, wmTuning{})}, logger)
			if err != nil {
				return err
			}
			return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic}).Publish(topic, msgs...)
		})
		if err != nil {
			drop()
			return "", nil, err
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+pgx.Identifier{schema, "watermill_" + wmForwarderTopic}.Sanitize()); err != nil {
		drop()
		return "", nil, err
	}
	settle(ctx, pool)
	return schema, drop, nil
}

// startWatermill runs the forwarder as a process of its own (this binary, command
// wm-forwarder), as outbox's relay runs, so their CPU and memory are measured alike.
func startWatermill(dbURL, natsURL, schema string, t wmTuning) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "wm-forwarder", "-db", dbURL, "-nats", natsURL, "-schema", schema, "-batch", strconv.Itoa(t.batch),
		"-delete-on-ack="+strconv.FormatBool(t.deleteOnAck), "-ack-async="+strconv.FormatBool(t.ackAsync))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd, cmd.Start()
}

// wmForwarder is the forwarder process.
func wmForwarder(args []string) error {
	fs := flag.NewFlagSet("wm-forwarder", flag.ExitOnError)
	dbURL := fs.String("db", "", "PostgreSQL URL")
	natsURL := fs.String("nats", "", "NATS URL")
	schema := fs.String("schema", "", "the backlog's schema")
	var t wmTuning
	fs.IntVar(&t.batch, "batch", 0, "SubscribeBatchSize (0: Watermill's default)")
	fs.BoolVar(&t.deleteOnAck, "delete-on-ack", false, "DeleteOnAck")
	fs.BoolVar(&t.ackAsync, "ack-async", false, "JetStream AckAsync")
	_ = fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := watermill.NopLogger{}
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		SchemaAdapter: wmSchema(*schema, t), OffsetsAdapter: wmOffsets(*schema, t),
		PollInterval: 100 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL:       *natsURL,
		JetStream: wmnats.JetStreamConfig{TrackMsgId: true, AckAsync: t.ackAsync},
	}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: wmForwarderTopic})
	if err != nil {
		return err
	}
	err = fwd.Run(ctx)
	_ = fwd.Close()
	_ = pub.Close()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// runWatermill drains a backlog of o.events through the Watermill forwarder into a
// JetStream stream and measures it as runDrain measures outbox's relay.
func runWatermill(dbURL, natsURL string, o drainOpts, t wmTuning) (drainResult, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return drainResult{}, err
	}
	defer pool.Close()
	prefix := testenv.UniqueName("benchwm")
	fmt.Printf("writing a backlog of %d events through Watermill's forwarder publisher (%d per transaction)...\n", o.events, o.perTx)
	schema, drop, err := wmBacklog(ctx, pool, o.events, o.perTx, prefix+".order")
	if err != nil {
		return drainResult{}, err
	}
	defer drop()
	js, closeStream, err := openStream(ctx, natsURL, prefix, jetstream.FileStorage)
	if err != nil {
		return drainResult{}, err
	}
	defer closeStream()
	start := time.Now()
	cmd, err := startWatermill(dbURL, natsURL, schema, t)
	if err != nil {
		return drainResult{}, err
	}
	defer stopProcess(cmd)
	return watchStream(ctx, js, prefix, o.events, start, []*exec.Cmd{cmd}, nil)
}
