package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
)

// Exactly-once into Kafka (--kafka-transactional-id), checked as a consumer sees it.
// No Kafka broker runs here: kfake, an in-process Kafka that speaks the protocol,
// transactions and read_committed included.

// kafkaScope is a kfake cluster and a relay's table.
type kafkaScope struct {
	cluster *kfake.Cluster
	url     string // kafka://...
}

func newKafkaScope(t *testing.T, opts ...kfake.Opt) *kafkaScope {
	t.Helper()
	k := &kafkaScope{}
	k.start(t, opts...)
	t.Cleanup(func() { k.cluster.Close() })
	return k
}

func (k *kafkaScope) start(t *testing.T, opts ...kfake.Opt) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, "outbox.event.order")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	k.cluster, k.url = c, "kafka://"+strings.Join(c.ListenAddrs(), ",")
}

// read returns the first n records of outbox.event.order at the isolation level, or
// fails the test after a minute.
func (k *kafkaScope) read(t *testing.T, n int, level kgo.IsolationLevel) []broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := k.poll(ctx, n, level)
	if len(got) < n {
		t.Fatalf("read %d of %d records from Kafka", len(got), n)
	}
	return got
}

// extra returns what a read_committed consumer sees past the first n records within
// a second: late duplicates. (None can be missed that the test is meant to see: every
// relay has stopped.)
func (k *kafkaScope) extra(n int) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return len(k.poll(ctx, n+1, kgo.ReadCommitted())) - n
}

func (k *kafkaScope) poll(ctx context.Context, n int, level kgo.IsolationLevel) []broker.Message {
	c, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...), kgo.ConsumeTopics("outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var out []broker.Message
	for len(out) < n && ctx.Err() == nil {
		c.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			m := broker.Message{Key: string(r.Key)}
			for _, h := range r.Headers {
				if h.Key == broker.HeaderID {
					m.ID = string(h.Value)
				}
			}
			out = append(out, m)
		})
	}
	return out
}

func eosArgs(url, table, brokerURL, txnID string, extra ...string) []string {
	return append([]string{"--db", url, "--table", table, "--broker", brokerURL, "--batch-size", "50",
		"--poll-interval", "50ms", "--kafka-transactional-id", txnID}, extra...)
}

// TestKafkaExactlyOnceCrash: the relay is killed (SIGKILL) at each point of a batch's
// way: claimed, in an open transaction, committed in Kafka but not marked, marked but
// not yet told to the publisher. The next relay finishes the table, and a
// read_committed consumer sees every event exactly once, in order per aggregate.
// A read_uncommitted consumer does see the aborted transaction's records, and the same
// kill without --kafka-transactional-id does duplicate: the check can fail.
func TestKafkaExactlyOnceCrash(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	for _, tc := range []struct {
		point string
		plain bool // the control: the idempotent publisher, no transactions
	}{
		{point: "relay.after-claim"},
		{point: "kafka.before-commit"},
		{point: "relay.after-publish-before-mark"},
		{point: "relay.after-mark"},
		{point: "relay.after-publish-before-mark", plain: true},
	} {
		name := tc.point
		if tc.plain {
			name += "/without-transactions"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
			k := newKafkaScope(t)
			const aggs, n = 7, 600
			want := writeEvents(t, pool, table, aggs, n)
			args := eosArgs(url, table.Schema+"."+table.Name, k.url, testenv.UniqueName("orders"))
			if tc.plain {
				args = args[:len(args)-2]
			}
			first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=" + tc.point + ":3"}, args...)
			first.killedByFailpoint(t)
			second := startRelayProc(t, nil, args...)
			waitUnpublished(t, pool, table, 0, time.Minute)
			_ = second.cmd.Process.Signal(syscall.SIGTERM)
			<-second.done

			got := k.read(t, n, kgo.ReadCommitted())
			if tc.plain {
				// At least once: the batch Kafka took before the kill goes again.
				if dups := k.extra(n); dups == 0 {
					t.Fatal("killed after the publish, the plain publisher sent nothing twice: the check below could not fail")
				} else {
					t.Logf("without transactions: %d duplicates", dups)
				}
				return
			}
			checkOrder(t, want, got)
			if dups := k.extra(n); dups > 0 {
				t.Fatalf("read_committed consumer saw %d duplicates", dups)
			}
			if tc.point == "kafka.before-commit" {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if all := k.poll(ctx, n+1, kgo.ReadUncommitted()); len(all) <= n {
					t.Fatalf("read_uncommitted saw %d records: the aborted transaction's should show", len(all))
				}
			}
			if !strings.Contains(second.output(), "resumed the transactional publisher") {
				t.Fatalf("the second relay never said it resumed:\n%s", second.output())
			}
		})
	}
}

// TestKafkaExactlyOnceCDC: a CDC relay (--mode cdc) killed at each point of a
// batch's way: read from the WAL, in an open transaction, committed in Kafka before
// the rows were marked, and marked before the position was confirmed (the slot sends
// those events again: the rows' marks skip them). Events are written as rows while
// it dies, in transactions of several events; a read_committed consumer sees every
// one exactly once, in order per aggregate, and the same kill without transactions
// duplicates.
func TestKafkaExactlyOnceCDC(t *testing.T) {
	t.Parallel()
	eosCDCKills(t, 600, func(t *testing.T, url string, pool *pgxpool.Pool) ([]outboxdriver.Table, []string) {
		t.Helper()
		table, _ := cdcTable(t, url, pool)
		return []outboxdriver.Table{table}, []string{"--table", table.Schema + "." + table.Name}
	})
}

// TestKafkaExactlyOnceSharedSlot is TestKafkaExactlyOnceCDC over one slot for two
// tables (--tables --mode cdc), each under a transactional id of its own. The shared
// slot's position waits for the slowest table, so the stream sends a faster table's
// events again from further back than a table alone would: the skip of marked rows
// is what keeps them from Kafka.
func TestKafkaExactlyOnceSharedSlot(t *testing.T) {
	t.Parallel()
	eosCDCKills(t, 300, func(t *testing.T, url string, pool *pgxpool.Pool) ([]outboxdriver.Table, []string) {
		t.Helper()
		prefix := testenv.UniqueName("ek")
		tables, slot := cdcTables(t, url, pool, prefix, 2)
		return tables, []string{"--tables", prefix + "_*.outbox", "--slot", slot}
	})
}

// eosCDCKills runs the kills of TestKafkaExactlyOnceCDC on the tables layout makes
// (and the relay flags that name them), n events written to each.
func eosCDCKills(t *testing.T, n int, layout func(t *testing.T, url string, pool *pgxpool.Pool) ([]outboxdriver.Table, []string)) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	for _, tc := range []struct {
		point string
		plain bool // the control: the idempotent publisher, no transactions
	}{
		{point: "wal.after-receive-before-publish:300"},
		{point: "kafka.before-commit:3"},
		{point: "relay.after-publish-before-mark:3"},
		{point: "wal.after-mark-before-confirm:3"},
		{point: "relay.after-publish-before-mark:3", plain: true},
	} {
		name := strings.Split(tc.point, ":")[0]
		if tc.plain {
			name += "/without-transactions"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tables, where := layout(t, url, pool)
			k := newKafkaScope(t)
			args := append([]string{"--db", url, "--broker", k.url, "--batch-size", "50", "--mode", "cdc"}, where...)
			if !tc.plain {
				args = append(args, "--kafka-transactional-id", testenv.UniqueName("orders"))
			}
			first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=" + tc.point}, args...)
			want := map[string][]string{}
			for _, table := range tables {
				for agg, ids := range writeEvents(t, pool, table, 7, n) {
					want[table.String()+"/"+agg] = ids
				}
			}
			first.killedByFailpoint(t)
			second := startRelayProc(t, nil, args...)
			for _, table := range tables {
				waitUnpublished(t, pool, table, 0, time.Minute)
			}
			total := n * len(tables)
			got := k.read(t, total, kgo.ReadCommitted())
			_ = second.cmd.Process.Signal(syscall.SIGTERM)
			<-second.done
			if tc.plain {
				if dups := k.extra(total); dups == 0 {
					t.Fatal("killed after the publish, the plain publisher sent nothing twice: the check below could not fail")
				} else {
					t.Logf("without transactions: %d duplicates", dups)
				}
				return
			}
			for i := range got {
				got[i].Key = tableOf(t, pool, tables, got[i].ID) + "/" + got[i].Key
			}
			checkOrder(t, want, got)
			if dups := k.extra(total); dups > 0 {
				t.Fatalf("read_committed consumer saw %d duplicates", dups)
			}
			if !strings.Contains(second.output(), "resumed the transactional publisher") {
				t.Fatalf("the second relay never said it resumed:\n%s", second.output())
			}
		})
	}
}

// TestKafkaExactlyOnceCrashMariaDB: the kill between the commit and the mark, on
// MariaDB: the resume marks what Kafka holds there too.
func TestKafkaExactlyOnceCrashMariaDB(t *testing.T) {
	t.Parallel()
	db, name := testenv.MariaDB(t, "outbox_")
	url := "mysql://root@127.0.0.1:3306/test"
	if _, stderr, code := runCLI(t, nil, "migrate", "--db", url, "--table", name); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	w, err := outbox.NewWriter(outboxmysql.New(db, &outboxdriver.Table{Name: name}), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const aggs, n = 7, 300
	want := map[string][]string{}
	for i := 0; i < n; i += 10 {
		evs := make([]outbox.Event, 10)
		for j := range evs {
			evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", (i+j)%aggs), Type: "Step", Payload: []byte(`{}`)}
		}
		if err := w.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			want[e.AggregateID] = append(want[e.AggregateID], e.ID)
		}
	}
	k := newKafkaScope(t)
	args := eosArgs(url, name, k.url, testenv.UniqueName("orders"))
	first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=relay.after-publish-before-mark:3"}, args...)
	first.killedByFailpoint(t)
	second := startRelayProc(t, nil, args...)
	testenv.Wait(t, ctx, "every row marked", func() bool {
		var left int
		_ = db.QueryRowContext(ctx, "SELECT count(*) FROM `"+name+"` WHERE published_at IS NULL").Scan(&left)
		return left == 0
	})
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done
	checkOrder(t, want, k.read(t, n, kgo.ReadCommitted()))
	if dups := k.extra(n); dups > 0 {
		t.Fatalf("read_committed consumer saw %d duplicates", dups)
	}
	if !strings.Contains(second.output(), "already_published=50") {
		t.Fatalf("the second relay did not mark the killed relay's batch from Kafka's progress:\n%s", second.output())
	}
}

// TestKafkaExactlyOnceTables: a relay of many tables (--tables) gives each table a
// transactional id of its own (the prefix, then the table's name); killed between a
// commit and its mark, the next process resumes every table, and a read_committed
// consumer sees each table's events once, in order.
func TestKafkaExactlyOnceTables(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	prefix := testenv.UniqueName("eos")
	tables := prefixedTables(t, pool, url, prefix, 3)
	want := map[string][]string{}
	for _, table := range tables {
		for agg, ids := range writeEvents(t, pool, table, 7, 200) {
			want[table.String()+"/"+agg] = ids
		}
	}
	k := newKafkaScope(t)
	args := []string{"--db", url, "--tables", prefix + "_*.outbox", "--broker", k.url, "--batch-size", "50",
		"--kafka-transactional-id", testenv.UniqueName("orders")}
	first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=relay.after-publish-before-mark:4"}, args...)
	first.killedByFailpoint(t)
	second := startRelayProc(t, nil, args...)
	for _, table := range tables {
		waitUnpublished(t, pool, table, 0, time.Minute)
	}
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done
	got := k.read(t, 600, kgo.ReadCommitted())
	for i := range got {
		got[i].Key = tableOf(t, pool, tables, got[i].ID) + "/" + got[i].Key
	}
	checkOrder(t, want, got)
	if dups := k.extra(600); dups > 0 {
		t.Fatalf("read_committed consumer saw %d duplicates", dups)
	}
	if n := strings.Count(second.output(), "resumed the transactional publisher"); n < len(tables) {
		t.Fatalf("%d resumes for %d tables:\n%s", n, len(tables), second.output())
	}
}

// TestKafkaExactlyOncePaused: the active relay, polling or CDC, is paused (SIGSTOP) in
// the middle of a transaction, past its --leader-timeout. The standby takes over and
// resumes, which fences the paused producer in Kafka; woken, the zombie's commit is
// refused, and it steps down. Every event reaches a read_committed consumer once, in order.
func TestKafkaExactlyOncePaused(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	for _, mode := range []string{"poll", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			table := modeTable(t, url, pool, mode)
			k := newKafkaScope(t)
			const aggs, n = 7, 400
			want := writeEvents(t, pool, table, aggs, n)
			args := eosArgs(url, table.Schema+"."+table.Name, k.url, testenv.UniqueName("orders"), "--leader-timeout", "2s", "--mode", mode)
			first := startRelayProc(t, []string{"OUTBOX_FAILPOINT=kafka.before-commit:3:stop"}, args...)
			testenv.Wait(t, context.Background(), "the active relay paused in a transaction", func() bool {
				return processStopped(first.cmd.Process.Pid)
			})
			second := startRelayProc(t, nil, args...)
			waitUnpublished(t, pool, table, 0, time.Minute)
			zombieFenced(t, k, pool, table, want, aggs, n, first, second)
		})
	}
}

// TestKafkaExactlyOnceBrokerFaults: the relay is held (SIGSTOP) with a transaction
// open while Kafka fails under it: a one-broker cluster restarts (same port, same
// data), or a three-broker cluster loses the broker that coordinates the relay's
// transactions. Woken, the relay commits or learns it must resume; either way a
// read_committed consumer sees every event once, in order.
func TestKafkaExactlyOnceBrokerFaults(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	for _, tc := range []struct {
		name  string
		opts  func(t *testing.T) []kfake.Opt
		fault func(t *testing.T, k *kafkaScope, txnID string)
	}{
		{"restart", func(t *testing.T) []kfake.Opt {
			t.Helper()
			return []kfake.Opt{kfake.Ports(testenv.FreePort(t)), kfake.DataDir(t.TempDir()), kfake.SyncWrites()}
		}, nil},
		{"coordinator lost", func(*testing.T) []kfake.Opt { return []kfake.Opt{kfake.NumBrokers(3)} },
			func(t *testing.T, k *kafkaScope, txnID string) {
				t.Helper()
				node := k.cluster.CoordinatorFor(txnID)
				if err := k.cluster.RemoveNode(node); err != nil {
					t.Fatal(err)
				}
				t.Logf("removed broker %d, the coordinator of %s", node, txnID)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
			opts := tc.opts(t)
			k := newKafkaScope(t, opts...)
			const aggs, n = 7, 400
			want := writeEvents(t, pool, table, aggs, n)
			txnID := testenv.UniqueName("orders")
			relayProc := startRelayProc(t, []string{"OUTBOX_FAILPOINT=kafka.before-commit:3:stop"},
				eosArgs(url, table.Schema+"."+table.Name, k.url, txnID, "--leader-timeout", "30s")...)
			testenv.Wait(t, context.Background(), "the relay held in a transaction", func() bool {
				return processStopped(relayProc.cmd.Process.Pid)
			})
			if tc.fault != nil {
				tc.fault(t, k, txnID)
			} else {
				k.cluster.Close()
				k.start(t, opts...)
			}
			_ = relayProc.cmd.Process.Signal(syscall.SIGCONT)
			waitUnpublished(t, pool, table, 0, time.Minute)
			_ = relayProc.cmd.Process.Signal(syscall.SIGTERM)
			<-relayProc.done
			checkOrder(t, want, k.read(t, n, kgo.ReadCommitted()))
			if dups := k.extra(n); dups > 0 {
				t.Fatalf("read_committed consumer saw %d duplicates", dups)
			}
			t.Logf("%s: the relay resumed %d times, fenced %d times", tc.name,
				strings.Count(relayProc.output(), "resumed the transactional publisher"), strings.Count(relayProc.output(), "publisher was fenced"))
		})
	}
}

// TestKafkaExactlyOnceGroup: a group of relays (--group), each lease partition with a
// transactional id of its own. r2 is paused (SIGSTOP) in an open transaction and loses
// its partitions; r1 takes them, and is killed between a commit and its mark; r3 takes
// everything, resumes each partition (which fences r2's producers and marks r1's
// committed batch) and drains the table. Woken, r2's commit is refused and it rejoins.
// A read_committed consumer sees every event once, in order per aggregate.
func TestKafkaExactlyOnceGroup(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	k := newKafkaScope(t)
	const aggs, n = 40, 800
	want := writeEvents(t, pool, table, aggs, n)
	txnID := testenv.UniqueName("orders")
	args := func(id string) []string {
		return eosArgs(url, table.Schema+"."+table.Name, k.url, txnID, "--group", "--relay-id", id, "--partition-lease", "3s")
	}
	r2 := startRelayProc(t, []string{"OUTBOX_FAILPOINT=kafka.before-commit:3:stop"}, args("r2")...)
	testenv.Wait(t, context.Background(), "r2 paused in a transaction", func() bool {
		return processStopped(r2.cmd.Process.Pid)
	})
	r1 := startRelayProc(t, []string{"OUTBOX_FAILPOINT=relay.after-publish-before-mark:3"}, args("r1")...)
	r1.killedByFailpoint(t)
	r3 := startRelayProc(t, nil, args("r3")...)
	waitUnpublished(t, pool, table, 0, time.Minute)
	zombieFenced(t, k, pool, table, want, aggs, n, r2, r3)
	if !strings.Contains(r3.output(), "partition=") || !strings.Contains(r3.output(), "resumed the transactional publisher") {
		t.Fatalf("r3 resumed no partition:\n%s", r3.output())
	}
	marked := 0
	for _, line := range strings.Split(r3.output(), "\n") {
		if strings.Contains(line, "resumed the transactional publisher") && !strings.Contains(line, "already_published=0") {
			marked++
		}
	}
	if marked == 0 {
		t.Fatalf("r3 marked nothing from Kafka's progress, though r1 was killed after a commit:\n%s", r3.output())
	}
}

// processStopped reports whether the process is stopped (by a signal).
// zombieFenced wakes a relay paused inside a transaction and waits until Kafka refuses
// its commit; then n more events are written, and once every row is marked the relays
// stop and a read_committed consumer must see every event of want once, in order.
func zombieFenced(t *testing.T, k *kafkaScope, pool *pgxpool.Pool, table outboxdriver.Table, want map[string][]string, aggs, n int, zombie *proc, others ...*proc) {
	t.Helper()
	_ = zombie.cmd.Process.Signal(syscall.SIGCONT) // mid-transaction
	testenv.Wait(t, context.Background(), "the woken relay's commit fenced", func() bool {
		return strings.Contains(zombie.output(), "the publisher was fenced")
	})
	for agg, ids := range writeEvents(t, pool, table, aggs, n) {
		want[agg] = append(want[agg], ids...)
	}
	waitUnpublished(t, pool, table, 0, time.Minute)
	for _, p := range append([]*proc{zombie}, others...) {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	}
	checkOrder(t, want, k.read(t, 2*n, kgo.ReadCommitted()))
	if dups := k.extra(2 * n); dups > 0 {
		t.Fatalf("read_committed consumer saw %d duplicates", dups)
	}
}

func processStopped(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	b := string(raw)
	// pid (comm) state ...: the state follows the last ')'.
	i := strings.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// TestKafkaExactlyOnceRefused: what exactly-once cannot run under is refused in one
// line: the flag with another broker, or CDC with rows deleted (usage errors,
// before anything connects), and a cluster without transactions (the relay exits).
func TestKafkaExactlyOnceRefused(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	table := migrateSchema(t, url, testenv.Schema(t, url), "outbox")
	name := table.Schema + "." + table.Name
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "nats://127.0.0.1:4222", "--kafka-transactional-id", "x"}, "goes with a kafka:// broker"},
		{[]string{"--broker", "kafka://127.0.0.1:1", "--kafka-transactional-id", "x", "--mode", "cdc", "--completion", "delete"}, "needs --completion mark"},
		{[]string{"--broker", "kafka://127.0.0.1:1", "--kafka-progress-topic", "p"}, "goes with --kafka-transactional-id"},
	} {
		_, stderr, code := runCLI(t, nil, append([]string{"relay", "--http=", "--db", url, "--table", name}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("relay %v: exit %d, %q; want a one-line usage error saying %q", tc.args, code, stderr, tc.want)
		}
	}
	noTxn := kversion.Stable()
	noTxn.SetMaxKeyVersion(int16(kmsg.InitProducerID), -1)
	k := newKafkaScope(t, kfake.MaxVersions(noTxn))
	p := startRelayProc(t, nil, eosArgs(url, name, k.url, "orders")...)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("the relay did not exit on a cluster without transactions")
	}
	if p.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(p.output(), "transactions are not available") {
		t.Fatalf("relay on a cluster without transactions: %v\n%s", p.cmd.ProcessState, p.output())
	}
}
