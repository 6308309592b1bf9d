package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
)

// The CDC peer: a thin relay built on a CDC library, as a team would write one in an
// afternoon, which #42 asks the CDC relay to be ahead of in the same run. It reads the
// slot with pglogrepl (its pgoutput parser, binary tuples as the relay asks for),
// publishes each inserted row to JetStream asynchronously with the row's id as the
// message id and its aggregate id as a header, and confirms a transaction's end to
// the server only once every publish of it and before it is acknowledged: at least
// once, as the relay. What it leaves out is what the relay adds: no per-aggregate
// hold or retries, no dead letters, no marks in the table, no table-less events,
// fewer headers.

// startCDCPeer runs the peer as a process of its own (this binary, command cdc-peer),
// as the relay runs, so their CPU and memory are measured alike.
func startCDCPeer(dbURL, natsURL, slot, publication, subject string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "cdc-peer", "-db", dbURL, "-nats", natsURL, "-slot", slot, "-publication", publication, "-subject", subject)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd, cmd.Start()
}

// peerTx is a transaction read from the slot: its end, to confirm, once its publishes
// are acknowledged.
type peerTx struct {
	end  pglogrepl.LSN
	acks []jetstream.PubAckFuture
}

// acked reports whether every publish of the transaction is acknowledged, checking
// from the first not yet seen; a refused publish is an error.
func (t *peerTx) acked() (bool, error) {
	for len(t.acks) > 0 {
		select {
		case <-t.acks[0].Ok():
			t.acks = t.acks[1:]
		case err := <-t.acks[0].Err():
			return false, err
		default:
			return false, nil
		}
	}
	return true, nil
}

// cdcPeer is the peer process.
func cdcPeer(args []string) error {
	fs := flag.NewFlagSet("cdc-peer", flag.ExitOnError)
	dbURL := fs.String("db", "", "PostgreSQL URL")
	natsURL := fs.String("nats", "", "NATS URL")
	slot := fs.String("slot", "", "the replication slot")
	publication := fs.String("publication", "", "the publication")
	subject := fs.String("subject", "", "the subject to publish to")
	_ = fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg, err := pgconn.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	if err := pglogrepl.StartReplication(ctx, conn, *slot, 0, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + *publication + "'", "binary 'true'"}}); err != nil {
		return err
	}

	type columns struct{ id, aggregateID, payload int }
	relations := map[uint32]columns{}
	var tx peerTx
	var waiting []*peerTx
	var confirmed pglogrepl.LSN
	nextStatus := time.Now()
	for {
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case pgconn.Timeout(err):
			msg = nil
		case err != nil:
			return err
		}
		reply := false
		if cd, ok := msg.(*pgproto3.CopyData); ok {
			switch cd.Data[0] {
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(cd.Data[1:])
				if err != nil {
					return err
				}
				m, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return err
				}
				switch m := m.(type) {
				case *pglogrepl.RelationMessage:
					c := columns{-1, -1, -1}
					for i, col := range m.Columns {
						switch col.Name {
						case "id":
							c.id = i
						case "aggregateid":
							c.aggregateID = i
						case "payload":
							c.payload = i
						}
					}
					if c.id < 0 || c.aggregateID < 0 || c.payload < 0 {
						return fmt.Errorf("relation %s.%s is not an outbox table", m.Namespace, m.RelationName)
					}
					relations[m.RelationID] = c
				case *pglogrepl.BeginMessage:
					tx = peerTx{}
				case *pglogrepl.InsertMessage:
					c, ok := relations[m.RelationID]
					if !ok {
						return fmt.Errorf("an insert into relation %d before its description", m.RelationID)
					}
					cols := m.Tuple.Columns
					id, err := uuid.FromBytes(cols[c.id].Data)
					if err != nil {
						return fmt.Errorf("id: %w", err)
					}
					body := cols[c.payload].Data
					if len(body) > 0 {
						body = body[1:] // jsonb's binary form: a version byte, then the text
					}
					f, err := js.PublishMsgAsync(&nats.Msg{Subject: *subject, Data: body,
						Header: nats.Header{"Outbox-Key": []string{string(cols[c.aggregateID].Data)}}}, jetstream.WithMsgID(id.String()))
					if err != nil {
						return err
					}
					tx.acks = append(tx.acks, f)
				case *pglogrepl.CommitMessage:
					waiting = append(waiting, &peerTx{end: m.TransactionEndLSN, acks: tx.acks})
					tx = peerTx{}
				}
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
				if err != nil {
					return err
				}
				reply = k.ReplyRequested
			}
		}
		if !reply && time.Now().Before(nextStatus) {
			continue
		}
		for len(waiting) > 0 {
			done, err := waiting[0].acked()
			if err != nil {
				return fmt.Errorf("publish refused: %w", err)
			}
			if !done {
				break
			}
			confirmed, waiting = waiting[0].end, waiting[1:]
		}
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: confirmed}); err != nil {
			return err
		}
		nextStatus = time.Now().Add(100 * time.Millisecond)
	}
}

// runCDCPeer drains a backlog of o.events through the CDC peer into a JetStream
// stream and measures it as runDrain measures the relay.
func runCDCPeer(dbURL, natsURL string, o drainOpts) (drainResult, error) {
	ctx := context.Background()
	pool, table, drop, err := scratch(ctx, dbURL, 8)
	if err != nil {
		return drainResult{}, err
	}
	defer drop()
	table.Write = outboxdriver.WriteMode(o.write) // rows, or insert-delete: the peer reads the inserts either way
	src, dropCDC, err := initCDC(ctx, pool, table)
	if err != nil {
		return drainResult{}, err
	}
	defer dropCDC()
	if err := writeBacklog(ctx, pool, table, o.events, o.perTx); err != nil {
		return drainResult{}, err
	}
	prefix := testenv.UniqueName("benchpeer")
	js, closeStream, err := openStream(ctx, natsURL, prefix, jetstream.FileStorage)
	if err != nil {
		return drainResult{}, err
	}
	defer closeStream()
	start := time.Now()
	cmd, err := startCDCPeer(dbURL, natsURL, src.Slot(), src.Publication(), prefix+".order")
	if err != nil {
		return drainResult{}, err
	}
	defer stopProcess(cmd)
	r, err := watchStream(ctx, js, prefix, o.events, start, []*exec.Cmd{cmd}, nil)
	if err != nil {
		return r, err
	}
	if cmd.ProcessState != nil {
		return r, errors.New("the CDC peer exited before the end")
	}
	return r, nil
}
