package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// ceiling is what the machine does for one of the relay's jobs done alone, with
// nothing else to do: the most events per second a relay could reach there.
type ceiling struct {
	name   string
	events int
	took   time.Duration
	cpu    float64 // seconds: the client's process (this one) is not counted
	server string  // whose CPU cpu is
}

func (c ceiling) rate() float64 { return float64(c.events) / c.took.Seconds() }

// ceilings are the three a drain is measured against.
type ceilings struct{ poll, cdc, broker ceiling }

// limits measures the machine's ceilings for the relay's work on the same PostgreSQL
// and NATS the relays use, one after the other:
//   - poll: claim and mark in 1,000-row batches on one connection, without a broker:
//     SELECT … ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED, then UPDATE … SET
//     published_at, per transaction. The least a polling relay that marks must ask of
//     the database.
//   - cdc: a logical replication reader on the table's slot and publication that
//     reads pgoutput's stream and throws it away.
//   - broker: JetStream asynchronous publishes with message ids to a file stream,
//     as many in flight as the client allows.
func limits(dbURL, natsURL string, args []string) error {
	fs := flag.NewFlagSet("limits", flag.ExitOnError)
	events := fs.Int("events", 200_000, "events in each measurement")
	_ = fs.Parse(args)
	c, err := measureCeilings(dbURL, natsURL, *events, outboxdriver.WriteRows)
	if err != nil {
		return err
	}
	printCeilings(c)
	return nil
}

// measureCeilings measures the three ceilings; the CDC one reads a backlog written
// in cdcWrite mode.
func measureCeilings(dbURL, natsURL string, events int, cdcWrite outboxdriver.WriteMode) (ceilings, error) {
	var c ceilings
	var err error
	ctx := context.Background()
	fmt.Printf("== ceiling: claim and mark (poll)\n")
	if c.poll, err = pollCeiling(ctx, dbURL, events); err != nil {
		return c, fmt.Errorf("poll ceiling: %w", err)
	}
	fmt.Printf("== ceiling: a discarding replication reader (cdc)\n")
	if c.cdc, err = cdcCeiling(ctx, dbURL, events, cdcWrite); err != nil {
		return c, fmt.Errorf("cdc ceiling: %w", err)
	}
	fmt.Printf("== ceiling: JetStream asynchronous publishes (broker)\n")
	if c.broker, err = brokerCeiling(ctx, natsURL, events); err != nil {
		return c, fmt.Errorf("broker ceiling: %w", err)
	}
	return c, nil
}

func printCeilings(c ceilings) {
	fmt.Printf("\n| ceiling | events/s | server CPU µs/event |\n|---|---|---|\n")
	for _, x := range []ceiling{c.poll, c.cdc, c.broker} {
		fmt.Printf("| %s | %.0f | %.1f (%s) |\n", x.name, x.rate(), x.cpu/float64(x.events)*1e6, x.server)
	}
}

// writeBacklog writes events through the writer, perTx to a transaction, over 1,000
// aggregates, then vacuums the table and checkpoints, as a relay would find it.
func writeBacklog(ctx context.Context, pool *pgxpool.Pool, table outboxdriver.Table, events, perTx int) error {
	w, err := outbox.NewWriter(outboxpgx.New(pool, &table), &outbox.Config{NotifyInterval: -1})
	if err != nil {
		return err
	}
	fmt.Printf("writing a backlog of %d events (~%d-byte payloads, %d per transaction, %s)...\n", events, len(payload(0)), perTx, table.Write)
	for i := 0; i < events; i += perTx {
		evs := make([]outbox.Event, 0, perTx)
		for j := i; j < min(i+perTx, events); j++ {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("customer-%04d", j%1000), Type: "OrderPlaced", Payload: payload(j)})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+pgx.Identifier{table.Schema, table.Name}.Sanitize()); err != nil {
		return err
	}
	settle(ctx, pool)
	return nil
}

func pollCeiling(ctx context.Context, dbURL string, events int) (ceiling, error) {
	c := ceiling{name: "poll: claim+mark, 1,000-row batches, one connection", events: events, server: "PostgreSQL backend"}
	pool, table, drop, err := scratchFor(ctx, dbURL, 2, "poll", "rows")
	if err != nil {
		return c, err
	}
	defer drop()
	if err := writeBacklog(ctx, pool, table, events, 1000); err != nil {
		return c, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return c, err
	}
	defer conn.Release()
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return c, err
	}
	q := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	claim := `SELECT seq, id::text, aggregatetype, aggregateid, type, payload, headers::text FROM ` + q + `
WHERE published_at IS NULL ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED`
	mark := `UPDATE ` + q + ` SET published_at = now() WHERE id = ANY($1::text[]::uuid[])`
	cpu0, start := cpuSeconds(backend), time.Now()
	for done := 0; done < events; {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, claim)
			if err != nil {
				return err
			}
			var ids []string
			var seq int64
			var id, at, aid, typ string
			var body []byte
			var headers *string
			if _, err := pgx.ForEachRow(rows, []any{&seq, &id, &at, &aid, &typ, &body, &headers}, func() error {
				ids = append(ids, id)
				return nil
			}); err != nil {
				return err
			}
			if len(ids) == 0 {
				return errors.New("nothing left to claim")
			}
			done += len(ids)
			_, err = tx.Exec(ctx, mark, ids)
			return err
		})
		if err != nil {
			return c, err
		}
	}
	c.took, c.cpu = time.Since(start), cpuSeconds(backend)-cpu0
	fmt.Printf("claimed and marked %d events in %v: %.0f events/s\n", events, c.took.Round(time.Millisecond), c.rate())
	return c, nil
}

// applicationName tells the ceiling's walsender in pg_stat_replication.
const applicationName = "outbox bench limits"

func cdcCeiling(ctx context.Context, dbURL string, events int, write outboxdriver.WriteMode) (ceiling, error) {
	c := ceiling{name: "cdc: a discarding pgoutput reader on the slot", events: events, server: "PostgreSQL walsender"}
	if write != outboxdriver.WriteRows {
		c.name += " (" + string(write) + ")"
	}
	pool, table, drop, err := scratch(ctx, dbURL, 2)
	if err != nil {
		return c, err
	}
	defer drop()
	table.Write = write
	src, dropCDC, err := initCDC(ctx, pool, table)
	if err != nil {
		return c, err
	}
	defer dropCDC()
	if err := writeBacklog(ctx, pool, table, events, 1000); err != nil {
		return c, err
	}
	rcfg := pool.Config().ConnConfig.Config.Copy()
	if rcfg.RuntimeParams == nil {
		rcfg.RuntimeParams = map[string]string{}
	}
	rcfg.RuntimeParams["replication"] = "database"
	rcfg.RuntimeParams["application_name"] = applicationName
	conn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return c, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// The options the relay streams with (pgcdc: protocol 1, binary values, messages).
	if err := pglogrepl.StartReplication(ctx, conn, src.Slot(), 0, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + src.Publication() + "'", "binary 'true'", "messages 'true'"}}); err != nil {
		return c, err
	}
	var walsender int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_replication WHERE application_name = $1`, applicationName).Scan(&walsender); err != nil {
		return c, err
	}
	cpu0, start := cpuSeconds(walsender), time.Now()
	var pos pglogrepl.LSN
	status := time.Now()
	for n := 0; n < events; {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			return c, fmt.Errorf("after %d inserts: %w", n, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			continue
		}
		reply := false
		switch cd.Data[0] {
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return c, err
			}
			if len(x.WALData) > 0 && x.WALData[0] == 'I' {
				n++
			}
			pos = x.WALStart + pglogrepl.LSN(len(x.WALData))
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return c, err
			}
			reply = k.ReplyRequested
		}
		if reply || time.Since(status) > time.Second {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
				return c, err
			}
			status = time.Now()
		}
	}
	c.took, c.cpu = time.Since(start), cpuSeconds(walsender)-cpu0
	fmt.Printf("read %d inserts from the slot in %v: %.0f events/s\n", events, c.took.Round(time.Millisecond), c.rate())
	return c, nil
}

func brokerCeiling(ctx context.Context, natsURL string, events int) (ceiling, error) {
	c := ceiling{name: "broker: JetStream async publish with message ids, file stream", events: events, server: "nats-server"}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return c, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return c, err
	}
	prefix := testenv.UniqueName("bench")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		return c, err
	}
	defer func() { _ = js.DeleteStream(context.Background(), prefix) }()
	server := pidOf("nats-server")
	cpu0, start := cpuSeconds(server), time.Now()
	acks := make([]jetstream.PubAckFuture, 0, events)
	for i := range events {
		msg := &nats.Msg{Subject: prefix + ".order", Data: payload(i), Header: nats.Header{"Outbox-Key": []string{fmt.Sprintf("customer-%04d", i%1000)}}}
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(uuid.NewString()))
		if err != nil {
			return c, err
		}
		acks = append(acks, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return c, errors.New("publishes not acknowledged after 5 minutes")
	}
	c.took, c.cpu = time.Since(start), cpuSeconds(server)-cpu0
	for _, f := range acks {
		select {
		case err := <-f.Err():
			return c, err
		default:
		}
	}
	fmt.Printf("published %d messages in %v: %.0f events/s\n", events, c.took.Round(time.Millisecond), c.rate())
	return c, nil
}
