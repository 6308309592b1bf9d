package pgcdc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/pgmessage"
	"github.com/outboxd/outbox/pgcdc"
)

// frames joins pgoutput messages as a fuzz input: each is a 4-byte length then the
// message.
func frames(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return b
}

func split(data []byte) [][]byte {
	var out [][]byte
	for len(data) >= 4 {
		n := int(binary.BigEndian.Uint32(data))
		data = data[4:]
		if n > len(data) {
			n = len(data)
		}
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

// Hand-built pgoutput messages (protocol 1, binary tuples) for the decoder's tests.
func begin(final uint64) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, final)
	b = binary.BigEndian.AppendUint64(b, 0)
	return binary.BigEndian.AppendUint32(b, 7)
}

func commit(lsn, end uint64) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, 0)
}

type col struct {
	name string
	oid  uint32
}

var outboxCols = []col{{"id", 2950}, {"aggregatetype", 25}, {"aggregateid", 25}, {"type", 25}, {"payload", 3802}, {"headers", 3802}, {"tracingspancontext", 25}, {"seq", 20}}

func relationMsg(id uint32, ns, name string, cols []col) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(append(b, ns...), 0)
	b = append(append(b, name...), 0)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = append(append(b, c.name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.oid)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

// insertMsg encodes values; nil is NULL.
func insertMsg(rel uint32, vals ...[]byte) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			b = append(b, 'n')
			continue
		}
		b = append(b, 'b')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func logicalMsg(transactional bool, lsn uint64, prefix string, content []byte) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

func decodeAll(t *testing.T, d *pgcdc.Decoder, msgs ...[]byte) []pgcdc.Change {
	t.Helper()
	var out []pgcdc.Change
	for _, m := range msgs {
		ch, err := d.Decode(m)
		if err != nil {
			t.Fatalf("decode %q: %v", m[:1], err)
		}
		out = append(out, ch)
	}
	return out
}

func TestDecodeInsertAndMessage(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0190d2a4-5b6c-7d8e-9f00-112233445566")
	seq := binary.BigEndian.AppendUint64(nil, 42)
	d := pgcdc.NewDecoder(outboxdriver.Table{}, "public.outbox")
	content, err := pgmessage.Encode(&outboxdriver.InsertEvent{ID: id.String(), AggregateType: "order", AggregateID: "7", Type: "Paid",
		Payload: []byte("\xff\x00raw"), Headers: []byte(`{"tenant":"t1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	chs := decodeAll(t, d,
		begin(100),
		relationMsg(1, "public", "other", []col{{"id", 23}}),
		insertMsg(1, []byte{0, 0, 0, 1}), // another table: not an event
		relationMsg(2, "public", "outbox", outboxCols),
		insertMsg(2, id[:], []byte("order"), []byte("7"), []byte("Placed"), []byte("\x01{\"a\": 1}"), []byte("\x01{\"k\": \"v\"}"), nil, seq),
		[]byte{'U', 0, 0, 0, 2}, // updates and deletes are ignored
		logicalMsg(true, 99, "public.outbox", content),
		logicalMsg(true, 98, "someone.else", content),
		logicalMsg(false, 97, "public.outbox", content),
		commit(100, 120),
	)
	kinds := []pgcdc.ChangeKind{pgcdc.ChangeBegin, pgcdc.ChangeNone, pgcdc.ChangeNone, pgcdc.ChangeNone, pgcdc.ChangeEvent,
		pgcdc.ChangeNone, pgcdc.ChangeEvent, pgcdc.ChangeNone, pgcdc.ChangeEvent, pgcdc.ChangeCommit}
	for i, ch := range chs {
		if ch.Kind != kinds[i] {
			t.Fatalf("change %d: kind %d, want %d", i, ch.Kind, kinds[i])
		}
	}
	row := chs[4].Row
	if row.ID != id.String() || row.AggregateType != "order" || row.AggregateID != "7" || row.Type != "Placed" ||
		string(row.Payload) != `{"a": 1}` || row.Headers["k"] != "v" || row.Seq != 42 || chs[4].Bad != nil {
		t.Fatalf("insert row: %+v bad=%v", row, chs[4].Bad)
	}
	msg := chs[6]
	if msg.Row.ID != id.String() || msg.Row.Type != "Paid" || !bytes.Equal(msg.Row.Payload, []byte("\xff\x00raw")) ||
		msg.Row.Headers["tenant"] != "t1" || msg.Row.Seq != 99 || msg.Reject != nil {
		t.Fatalf("message row: %+v reject=%v", msg.Row, msg.Reject)
	}
	if chs[8].Reject == nil {
		t.Fatal("a non-transactional message must be rejected: it may come from a rolled-back transaction")
	}
	if chs[9].EndLSN != 120 || d.InTransaction() {
		t.Fatalf("commit: %+v, in transaction %v", chs[9], d.InTransaction())
	}
}

func TestDecodeBadInput(t *testing.T) {
	t.Parallel()
	d := pgcdc.NewDecoder(outboxdriver.Table{}, "public.outbox")
	for name, m := range map[string][]byte{
		"empty":             {},
		"unknown type":      {'Z'},
		"short begin":       {'B', 1, 2},
		"insert before rel": insertMsg(9, []byte("x")),
		"bad relation":      {'R', 0, 0, 0, 1, 'p'},
		"lying column size": {'I', 0, 0, 0, 2, 'N', 0, 1, 'b', 0x7f, 0xff, 0xff, 0xff},
	} {
		if _, err := d.Decode(m); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// An event whose content is not an outbox event is reported, not fatal.
	ch, err := d.Decode(logicalMsg(true, 1, "public.outbox", []byte("not json\n")))
	if err != nil || ch.Kind != pgcdc.ChangeEvent || ch.Bad == nil {
		t.Fatalf("bad content: %+v, %v", ch, err)
	}
	if _, err := d.Decode(relationMsg(2, "public", "outbox", outboxCols)); err != nil {
		t.Fatal(err)
	}
	ch, err = d.Decode(insertMsg(2, []byte("short"), []byte("a"), []byte("b"), []byte("c"), []byte("\x01{}"), nil, nil, nil))
	if err != nil || ch.Bad == nil {
		t.Fatalf("bad uuid: %+v, %v", ch, err)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := outboxdriver.InsertEvent{ID: uuid.NewString(), AggregateType: "a", AggregateID: "line\nbreak", Type: "T",
		Payload: nil, TraceContext: "traceparent=00-x", AvailableAt: at}
	c, err := pgmessage.Encode(&ev)
	if err != nil {
		t.Fatal(err)
	}
	row, gotAt, err := pgmessage.Decode(c)
	if err != nil {
		t.Fatal(err)
	}
	if row.ID != ev.ID || row.AggregateID != ev.AggregateID || !row.PayloadNull || row.Payload != nil || row.TraceContext != ev.TraceContext || !gotAt.Equal(at) {
		t.Fatalf("round trip: %+v at %v", row, gotAt)
	}
}

// FuzzDecode feeds sequences of pgoutput messages to one decoder: it must never
// panic, and an event it accepts must be a well-formed outbox event. The committed
// corpus (testdata/fuzz/FuzzDecode) holds real PostgreSQL output: see
// TestWriteFuzzCorpus.
func FuzzDecode(f *testing.F) {
	id := uuid.New()
	content, _ := pgmessage.Encode(&outboxdriver.InsertEvent{ID: id.String(), AggregateType: "o", AggregateID: "1", Type: "T", Payload: []byte(`{}`)})
	f.Add(frames(begin(10), relationMsg(2, "public", "outbox", outboxCols),
		insertMsg(2, id[:], []byte("order"), []byte("7"), []byte("Placed"), []byte("\x01{}"), nil, nil, binary.BigEndian.AppendUint64(nil, 1)),
		logicalMsg(true, 9, "public.outbox", content), commit(10, 11)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := pgcdc.NewDecoder(outboxdriver.Table{}, "public.outbox")
		for _, m := range split(data) {
			ch, err := d.Decode(m)
			if err != nil || ch.Kind != pgcdc.ChangeEvent || ch.Bad != nil {
				continue
			}
			if _, err := uuid.Parse(ch.Row.ID); err != nil {
				t.Fatalf("accepted an event with id %q", ch.Row.ID)
			}
			if ch.Row.PayloadNull && ch.Row.Payload != nil {
				t.Fatal("a NULL payload with bytes")
			}
		}
	})
}

// TestWriteFuzzCorpus regenerates the committed corpus from the real server:
// PGCDC_WRITE_CORPUS=1 go test -run TestWriteFuzzCorpus ./pgcdc.
func TestWriteFuzzCorpus(t *testing.T) {
	t.Parallel()
	if os.Getenv("PGCDC_WRITE_CORPUS") == "" {
		t.Skip("set PGCDC_WRITE_CORPUS=1 to regenerate testdata/fuzz/FuzzDecode from PostgreSQL")
	}
	ctx := context.Background()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage} {
		e := setup(t, mode)
		slot := e.slot + "_corpus"
		if _, err := e.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			t.Fatal(err)
		}
		src := e.source(t, nil) // creates the publication
		_ = src
		w, _ := outbox.NewWriter(e.drv, nil)
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return w.WriteTx(ctx, tx,
				outbox.Event{AggregateType: "order", AggregateID: "1", Type: "Placed", Payload: []byte(`{"total": 10}`), Headers: map[string]string{"tenant": "t"}},
				outbox.Event{AggregateType: "order", AggregateID: "2", Type: "Paid", Payload: []byte(`null`)})
		})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := e.pool.Query(ctx, `SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
  'proto_version', '1', 'publication_names', $2, 'binary', 'true', 'messages', 'true')`, slot, e.slot)
		if err != nil {
			t.Fatal(err)
		}
		var msgs [][]byte
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, b)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		dropSlot(t, e.pool, slot)
		// The fuzz decoder expects public.outbox: rewrite the test's schema (the
		// names are NUL-terminated, so no length changes).
		for i, m := range msgs {
			m = bytes.ReplaceAll(m, []byte(e.table.Schema+"\x00"), []byte("public\x00"))
			msgs[i] = bytes.ReplaceAll(m, []byte(e.table.Schema+".outbox\x00"), []byte("public.outbox\x00"))
		}
		data := frames(msgs...)
		dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		file := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, "postgres-"+string(mode)), []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
