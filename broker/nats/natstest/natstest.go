// Package natstest reads what tests published to NATS JetStream, and makes and
// removes their streams. It lives in the NATS publisher's module, which has the NATS
// client already, so that no module an importer resolves requires a test-only one
// (docs/layout.md#modules).
package natstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/testenv"
)

// URLDefault is the machine's NATS server, overridden by TEST_NATS_URL.
const URLDefault = "nats://127.0.0.1:4222"

// URL returns the machine's NATS URL after checking it answers with JetStream, and
// keeps its streams folder (KeepStreamsDir): the packages' tests run at once against
// the one server, each creating and deleting streams of its own.
func URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("TEST_NATS_URL")
	if url == "" {
		url = URLDefault
	}
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		testenv.Missing(t, "NATS at %s: %v", url, err)
	}
	nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := KeepStreamsDir(ctx, url); err != nil {
		t.Fatal(err)
	}
	return url
}

// KeepName is the stream KeepStreamsDir leaves on a server.
const KeepName = "OUTBOX_TEST_KEEP"

// errStoreFailed is JetStream's "error creating store for stream".
const errStoreFailed jetstream.ErrorCode = 10049

// KeepStreamsDir makes sure the server at url holds a stream no test deletes. A 2.9
// server removes an account's streams folder, in a goroutine, when its last stream is
// deleted; a file stream created meanwhile (another test's, as one's cleanup deletes
// the last) fails with "error creating store for stream". A server with a stream left
// never does that. The keep stream's own creation can meet that race once: it is
// tried again.
func KeepStreamsDir(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := jetstream.StreamConfig{Name: KeepName, Subjects: []string{"outbox_test_keep.>"}, MaxMsgs: 1}
	for {
		_, err := js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != errStoreFailed {
			if err != nil {
				return fmt.Errorf("natstest: the stream that keeps the streams folder: %w", err)
			}
			return nil
		}
		pause := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			return fmt.Errorf("natstest: the stream that keeps the streams folder: %w", err)
		case <-pause.C:
		}
	}
}

// Read returns the first n messages stored in stream on subject (">" for all),
// waiting until there are n or ctx ends. Keys come from the Outbox-Key header and ids
// from Nats-Msg-Id, as the NATS publisher writes them.
func Read(ctx context.Context, url, stream, subject string, n int) ([]broker.Message, error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var out []broker.Message
	for ctx.Err() == nil {
		out = out[:0]
		cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			time.Sleep(50 * time.Millisecond) //nolint:forbidigo // a retry's pause: the stream may not exist yet; the caller's ctx bounds it
			continue
		}
		for len(out) < n {
			batch, err := cons.FetchNoWait(min(n-len(out), 1000))
			if err != nil {
				return nil, err
			}
			got := 0
			for m := range batch.Messages() {
				got++
				h := m.Headers()
				hm := make(map[string]string, len(h))
				for k := range h {
					hm[k] = h.Get(k)
				}
				out = append(out, broker.Message{ID: h.Get("Nats-Msg-Id"), Topic: m.Subject(), Key: h.Get("Outbox-Key"), Payload: m.Data(), Headers: hm})
			}
			if got == 0 {
				break
			}
		}
		if len(out) >= n {
			return out, nil
		}
		time.Sleep(50 * time.Millisecond) //nolint:forbidigo // polls until n messages came; the caller's ctx bounds it
	}
	return out, fmt.Errorf("read %d of %d messages: %w", len(out), n, ctx.Err())
}

// DeleteStream removes a test's JetStream stream, ignoring errors (for t.Cleanup).
func DeleteStream(url, name string) {
	nc, err := nats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteStream(ctx, name)
}

// Stream creates a JetStream stream named name over the subjects name.>, on the
// NATS server at url, deleted when the test ends.
func Stream(t testing.TB, url, name string) jetstream.Stream {
	t.Helper()
	_, stream := CreateStream(t, url, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	return stream
}

// CreateStream creates the stream cfg describes on the NATS server at url, deleted
// when the test ends, and returns it with the JetStream client that made it (its
// connection closed when the test ends).
func CreateStream(t testing.TB, url string, cfg jetstream.StreamConfig) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DeleteStream(url, cfg.Name) })
	return js, stream
}
