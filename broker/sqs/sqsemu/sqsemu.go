// Package sqsemu runs the SQS emulator the tests use: fauxqs, a Node.js program
// that speaks SQS's JSON protocol (the one today's AWS SDKs send) with FIFO queues,
// message groups and deduplication ids, pinned by this folder's package-lock.json
// (`npm ci` here; .ci/run does it).
package sqsemu

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxd/outbox/broker"
)

// Region is the region the emulator's clients use.
const Region = "us-east-1"

// Start runs an emulator on a free loopback port, stopped when the test ends, and
// returns its endpoint. Without Node.js or the installed emulator the test is
// skipped, or fails under CI.
func Start(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	cli := filepath.Join(filepath.Dir(file), "node_modules", "fauxqs", "dist", "cli.js")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(cli)
	}
	if err != nil {
		missing(t, "the SQS emulator (Node.js and `npm ci` in broker/sqs/sqsemu): %v", err)
	}
	// Port 0: the system picks a free port and the emulator logs it. (Picking one
	// here and handing it over races with other test processes: the emulator could
	// fail to bind while another one answers on that port.)
	cmd := exec.Command(node, cli)
	cmd.Env = append(os.Environ(), "FAUXQS_PORT=0", "FAUXQS_LOGGER=true", "FAUXQS_DEFAULT_REGION="+Region)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	listening := make(chan string, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case port := <-listening:
		return "http://127.0.0.1:" + port
	case <-done:
		t.Fatalf("the SQS emulator exited at start")
	case <-time.After(20 * time.Second):
		t.Fatalf("the SQS emulator did not say where it listens")
	}
	return ""
}

// listenLine is the emulator's log line naming its port.
var listenLine = regexp.MustCompile(`Server listening at http://127\.0\.0\.1:(\d+)`)

func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("service missing under CI: "+format, args...)
	}
	t.Skipf("service missing: "+format, args...)
}

// Client is an SQS client on the emulator at endpoint (static test credentials).
func Client(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// Env is what `outbox relay --broker sqs://...` needs in its environment to reach
// the emulator.
func Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=" + Region, "AWS_EC2_METADATA_DISABLED=true"}
}

// Reader reads queues back in order, deleting what it received (an undeleted FIFO
// message would hide its group's later ones), and keeps what it read.
type Reader struct {
	c      *sqs.Client
	decode Decoder
	mu     sync.Mutex
	seen   map[string][]broker.Message // queue name -> messages, in receive order
}

// Decoder turns a received message back into the one published: broker/sqs's
// DecodeMessage, passed in so that this module does not depend on the publisher's
// (whose tests depend on this one).
type Decoder func(types.Message) (broker.Message, error)

// NewReader reads with c, decoding with decode.
func NewReader(c *sqs.Client, decode Decoder) *Reader {
	return &Reader{c: c, decode: decode, seen: map[string][]broker.Message{}}
}

// Read returns the first n messages of queue, waiting until there are n or ctx ends.
func (r *Reader) Read(ctx context.Context, queue string, n int) ([]broker.Message, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var qurl *string
	for len(r.seen[queue]) < n {
		if ctx.Err() != nil {
			return r.seen[queue], ctx.Err()
		}
		if qurl == nil {
			out, err := r.c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			qurl = out.QueueUrl
		}
		out, err := r.c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: qurl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			if ctx.Err() != nil {
				return r.seen[queue], ctx.Err()
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, m := range out.Messages {
			d, err := r.decode(m)
			if err != nil {
				return nil, err
			}
			d.Topic = queue
			r.seen[queue] = append(r.seen[queue], d)
			if _, err := r.c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: qurl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				return nil, err
			}
		}
	}
	return r.seen[queue][:n], nil
}
