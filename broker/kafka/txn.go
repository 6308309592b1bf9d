package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/failpoint"
)

// Exactly-once: a TxPublisher sends each batch in one Kafka transaction, together with
// a progress record that lists the ids of the events Kafka now holds but the database
// may not mark yet. Kafka commits both or neither, so after any crash the next owner
// reads the last committed progress record and marks those rows instead of sending
// them again; a consumer reading with isolation.level=read_committed sees each event
// once. The owner before it is fenced by Kafka itself: the new owner's producer
// (same transactional.id) bumps the epoch, which aborts the old one's open transaction
// and refuses its later ones.
//
// Progress records go to partition 0 of a compacted topic, keyed progress/<id> (one
// per transactional.id); a resume first commits a marker keyed resume/<id> of its own,
// so it knows, by that marker's offset, where the committed records it must read end.

// ProgressTopicDefault is TxConfig.ProgressTopic's default.
const ProgressTopicDefault = "outbox.progress"

// TransactionTimeoutDefault is TxConfig.TransactionTimeout's default.
const TransactionTimeoutDefault = time.Minute

// TxConfig configures a TxPublisher.
type TxConfig struct {
	Config
	// TransactionalID is the producer's transactional.id: one per outbox table (a
	// group of relays adds one per lease partition, ID.p<N>: Unit). A relay that
	// resumes with the same id fences every relay before it. Required.
	TransactionalID string
	// ProgressTopic is the compacted topic that holds the progress records; Resume
	// creates it (one partition, cleanup.policy=compact) or checks that it compacts.
	// Default ProgressTopicDefault.
	ProgressTopic string
	// TransactionTimeout is the producer's transaction.timeout.ms: how long Kafka
	// keeps a transaction open before it aborts it (a relay killed in the middle of
	// one). Default TransactionTimeoutDefault.
	TransactionTimeout time.Duration
}

// TxPublisher publishes each batch in a Kafka transaction with its progress (see
// broker.Ledger). Build it with DialTransactional. It must not publish from two
// goroutines at once (the relay never does).
type TxPublisher struct {
	cfg  TxConfig
	opts []kgo.Opt // the connection's and ClientOptions; the transactional ones are added per client

	mu      sync.Mutex
	cl      *kgo.Client         // the producer of the current term (nil until Resume)
	ready   error               // nil once resumed; why it may not publish otherwise
	pending map[string]struct{} // ids committed to Kafka whose rows may not be marked yet
}

var _ broker.UnitLedger = (*TxPublisher)(nil)

// Errors Resume returns for a configuration that cannot work; both are permanent
// (broker.IsPermanent), so the relay stops on them rather than retry.
var (
	// ErrNoTransactions: the cluster (or the user) cannot run transactions.
	ErrNoTransactions error = permanentError("kafka: transactions are not available")
	// ErrProgressTopic: the progress topic cannot be created, or does not compact.
	ErrProgressTopic error = permanentError("kafka: the progress topic cannot be used")
)

type permanentError string

func (e permanentError) Error() string        { return string(e) }
func (e permanentError) Is(target error) bool { return target == broker.ErrPermanent }

// DialTransactional returns a transactional publisher for the cluster a kafka:// URL
// names (see ConnectOptions); extra client options follow the publisher's own. It
// connects only on Resume: the relay calls Resume once it is the table's active relay.
func DialTransactional(rawURL string, cfg *TxConfig, extra ...kgo.Opt) (*TxPublisher, error) {
	if cfg == nil || cfg.TransactionalID == "" {
		return nil, errors.New("kafka transactions: a transactional id is required")
	}
	conn, err := ConnectOptions(rawURL)
	if err != nil {
		return nil, err
	}
	p := &TxPublisher{cfg: *cfg, opts: append(append(ClientOptions(), conn...), extra...), pending: map[string]struct{}{},
		ready: fmt.Errorf("%w: not resumed yet", broker.ErrFenced)}
	if p.cfg.MaxMessageBytes <= 0 {
		p.cfg.MaxMessageBytes = MaxMessageBytesDefault
	}
	if p.cfg.DeliveryTimeout <= 0 {
		p.cfg.DeliveryTimeout = DeliveryTimeoutDefault
	}
	if p.cfg.ProgressTopic == "" {
		p.cfg.ProgressTopic = ProgressTopicDefault
	}
	if err := ValidateTopic(p.cfg.ProgressTopic); err != nil {
		return nil, fmt.Errorf("kafka progress topic: %w", err)
	}
	if p.cfg.TransactionTimeout <= 0 {
		p.cfg.TransactionTimeout = TransactionTimeoutDefault
	}
	return p, nil
}

// Unit implements broker.UnitLedger: a publisher of its own, not resumed yet, with
// the transactional id ID.name (a group's lease partition: ID.p3) and its own progress
// records.
func (p *TxPublisher) Unit(name string) (broker.Ledger, error) {
	if name == "" {
		return nil, errors.New("kafka transactions: a unit needs a name")
	}
	u := &TxPublisher{cfg: p.cfg, opts: p.opts, pending: map[string]struct{}{},
		ready: fmt.Errorf("%w: not resumed yet", broker.ErrFenced)}
	u.cfg.TransactionalID += "." + name
	return u, nil
}

// progress is a progress record's value.
type progress struct {
	// IDs are events Kafka holds whose rows the database may not mark yet.
	IDs []string `json:"ids"`
}

func (p *TxPublisher) progressKey() []byte { return []byte("progress/" + p.cfg.TransactionalID) }
func (p *TxPublisher) resumeKey() []byte   { return []byte("resume/" + p.cfg.TransactionalID) }

// onProgressPartition places a record on the progress topic's partition 0.
func (p *TxPublisher) onProgressPartition(key, value []byte) *kgo.Record {
	return &kgo.Record{Topic: p.cfg.ProgressTopic, Partition: 0, Key: key, Value: value,
		Context: context.WithValue(context.Background(), placedKey{}, true)}
}

// Resume implements broker.Ledger: a new producer with the transactional id (Kafka
// aborts the previous owner's open transaction and fences it), then the ids of the
// last committed progress record. Refused at once, with ErrNoTransactions, by a cluster
// or a user that cannot run transactions.
func (p *TxPublisher) Resume(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cl != nil {
		p.cl.Close()
		p.cl = nil
	}
	p.ready = fmt.Errorf("%w: the last resume failed", broker.ErrFenced)
	cl, err := kgo.NewClient(append(slices.Clone(p.opts),
		kgo.TransactionalID(p.cfg.TransactionalID), kgo.TransactionTimeout(p.cfg.TransactionTimeout))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	ids, err := p.resume(ctx, cl)
	if err != nil {
		cl.Close()
		return nil, err
	}
	p.cl, p.ready = cl, nil
	clear(p.pending)
	for _, id := range ids {
		p.pending[id] = struct{}{}
	}
	return ids, nil
}

func (p *TxPublisher) resume(ctx context.Context, cl *kgo.Client) ([]string, error) {
	if err := p.ensureProgressTopic(ctx, cl); err != nil {
		return nil, err
	}
	switch id, _, err := cl.ProducerID(ctx); {
	case err != nil:
		return nil, transactionsRefused(p.cfg.TransactionalID, err)
	case id < 0: // the client found no InitProducerID to ask
		return nil, transactionsRefused(p.cfg.TransactionalID, kerr.UnsupportedVersion)
	}
	// A marker committed now ends what must be read: every transaction of an earlier
	// owner is committed or aborted before it (the new epoch saw to that).
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("kafka: begin the resume transaction: %w", err)
	}
	r, err := cl.ProduceSync(ctx, p.onProgressPartition(p.resumeKey(), []byte(`{}`))).First()
	if err != nil {
		_ = cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
		return nil, transactionsRefused(p.cfg.TransactionalID, fmt.Errorf("write the resume marker to %s: %w", p.cfg.ProgressTopic, err))
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return nil, transactionsRefused(p.cfg.TransactionalID, fmt.Errorf("commit the resume marker: %w", err))
	}
	return p.lastProgress(ctx, r.Offset)
}

// transactionsRefused says, in one line, why a producer could not start transactions.
func transactionsRefused(id string, err error) error {
	switch {
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return fmt.Errorf("%w: the user may not use transactional id %q (grant WRITE and DESCRIBE on it): %w", ErrNoTransactions, id, err)
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("%w: the user may not start an idempotent producer (grant IDEMPOTENT_WRITE on the cluster): %w", ErrNoTransactions, err)
	case errors.Is(err, kerr.UnsupportedVersion), errors.Is(err, kerr.CoordinatorNotAvailable), strings.Contains(err.Error(), "does not support"):
		return fmt.Errorf("%w: the cluster does not run transactions (Kafka 0.11 or later, with a transaction state topic): %w", ErrNoTransactions, err)
	}
	return fmt.Errorf("kafka transactions: %w", err)
}

// ensureProgressTopic creates the progress topic, compacted, or checks that it is.
func (p *TxPublisher) ensureProgressTopic(ctx context.Context, cl *kgo.Client) error {
	topic := p.cfg.ProgressTopic
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, -1
	c := kmsg.NewCreateTopicsRequestTopicConfig()
	c.Name, c.Value = "cleanup.policy", kmsg.StringPtr("compact")
	rt.Configs = append(rt.Configs, c)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: create the progress topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("kafka: create the progress topic %s: %d answers", topic, len(resp.Topics))
	}
	switch err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); {
	case err == nil:
		return nil
	case kerr.IsRetriable(err):
		return fmt.Errorf("kafka: create the progress topic %s: %w", topic, err)
	case !errors.Is(err, kerr.TopicAlreadyExists):
		return fmt.Errorf("%w: create %s (or create it yourself, cleanup.policy=compact): %w", ErrProgressTopic, topic, err)
	}
	dreq := kmsg.NewPtrDescribeConfigsRequest()
	dr := kmsg.NewDescribeConfigsRequestResource()
	dr.ResourceType, dr.ResourceName, dr.ConfigNames = kmsg.ConfigResourceTypeTopic, topic, []string{"cleanup.policy"}
	dreq.Resources = append(dreq.Resources, dr)
	dresp, err := dreq.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: check the progress topic %s: %w", topic, err)
	}
	for _, res := range dresp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return fmt.Errorf("kafka: check the progress topic %s: %w", topic, err)
		}
		for _, c := range res.Configs {
			if c.Name == "cleanup.policy" && (c.Value == nil || !strings.Contains(*c.Value, "compact")) {
				return fmt.Errorf("%w: %s exists with cleanup.policy=%s; it must compact (cleanup.policy=compact)", ErrProgressTopic, topic, deref(c.Value))
			}
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// lastProgress returns the ids of the last committed progress record of this
// transactional id before the resume marker at offset end: read committed, from a
// short way back, further back while none is found.
func (p *TxPublisher) lastProgress(ctx context.Context, end int64) ([]string, error) {
	for back := int64(64); ; back *= 16 {
		start := max(0, end-back)
		rec, err := p.readProgress(ctx, start, end)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			var pr progress
			if err := json.Unmarshal(rec.Value, &pr); err != nil {
				return nil, fmt.Errorf("kafka: the progress record at %s/0@%d is not one of ours: %w", p.cfg.ProgressTopic, rec.Offset, err)
			}
			return pr.IDs, nil
		}
		if start == 0 {
			return nil, nil // this id never committed a batch
		}
	}
}

// readProgress returns the last progress record of this id in [start, end), or nil.
func (p *TxPublisher) readProgress(ctx context.Context, start, end int64) (*kgo.Record, error) {
	cl, err := kgo.NewClient(append(slices.Clone(p.opts), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.cfg.ProgressTopic: {0: kgo.NewOffset().At(start)}}))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	key := p.progressKey()
	var last *kgo.Record
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka: read the progress topic %s: %w", p.cfg.ProgressTopic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil && !kerr.IsRetriable(ferr) {
			return nil, fmt.Errorf("kafka: read the progress topic %s: %w", p.cfg.ProgressTopic, ferr)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				done = true
				return
			}
			if string(r.Key) == string(key) {
				last = r
			}
		})
		if done {
			return last, nil
		}
	}
}

// Publish implements broker.Publisher: the events Kafka already holds (committed by
// an earlier batch, this relay's or a previous owner's) are answered at once and not
// sent; the others go in one transaction with the batch's progress record. If any
// record fails, the transaction is aborted: the failing record keeps its error and
// the others are held back, to go again. A commit Kafka refuses or leaves unknown
// fails the batch with broker.ErrFenced (wrapped as unavailable): only a resume can
// tell what was committed.
func (p *TxPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ready != nil {
		return broker.AllUnavailable(len(msgs), p.ready)
	}
	results := make([]broker.Result, len(msgs))
	var (
		send []broker.Message
		idx  []int
		seen = make(map[string]bool, len(msgs))
	)
	for i := range msgs {
		id := msgs[i].ID
		if _, ok := p.pending[id]; ok || seen[id] {
			continue // in Kafka already, or once in this batch: answered
		}
		seen[id] = true
		send, idx = append(send, msgs[i]), append(idx, i)
	}
	if len(send) == 0 {
		return results
	}
	if err := p.cl.BeginTransaction(); err != nil {
		return p.mustResume(results, idx, fmt.Errorf("begin a transaction: %w", err))
	}
	sent := make([]bool, len(send))
	res := publish(ctx, p.cl, &p.cfg.Config, send, sent)
	failed := false
	for j, r := range res {
		if fenced(r.Err) {
			return p.mustResume(results, idx, r.Err)
		}
		results[idx[j]] = r
		failed = failed || (sent[j] && r.Err != nil)
	}
	if !failed {
		failed = !p.commit(ctx, send, res, results, idx)
		if !failed || p.ready != nil {
			return results
		}
	}
	// A record in the transaction failed: none of it may stay.
	actx := context.WithoutCancel(ctx)
	if err := p.cl.AbortBufferedRecords(actx); err != nil {
		return p.mustResume(results, idx, fmt.Errorf("abort a transaction: %w", err))
	}
	if err := p.cl.EndTransaction(actx, kgo.TryAbort); err != nil {
		return p.mustResume(results, idx, fmt.Errorf("abort a transaction: %w", err))
	}
	for j := range res {
		if sent[j] && results[idx[j]].Err == nil {
			results[idx[j]].Err = fmt.Errorf("%w: its transaction was aborted for another record's failure", broker.ErrHeldBack)
		}
	}
	return results
}

// commit produces the progress record and commits the transaction. It reports false,
// with the transaction still open, when the progress record failed.
func (p *TxPublisher) commit(ctx context.Context, send []broker.Message, res, results []broker.Result, idx []int) bool {
	ids := make([]string, 0, len(p.pending)+len(send))
	for id := range p.pending {
		ids = append(ids, id)
	}
	for j := range send {
		if res[j].Err == nil {
			ids = append(ids, send[j].ID)
		}
	}
	value, _ := json.Marshal(progress{IDs: ids})
	pctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	if err := p.cl.ProduceSync(pctx, p.onProgressPartition(p.progressKey(), value)).FirstErr(); err != nil {
		err = broker.Unavailable(fmt.Errorf("kafka: write the progress record: %w", err))
		for j := range send {
			if res[j].Err == nil {
				results[idx[j]].Err = err
			}
		}
		return false
	}
	failpoint.Hit(failpoint.KafkaBeforeCommit)
	// Not ctx: a commit cut short leaves its outcome unknown.
	if err := p.cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryCommit); err != nil {
		p.mustResume(results, idx, fmt.Errorf("commit: %w", err))
		return false
	}
	for j := range send {
		if res[j].Err == nil {
			p.pending[send[j].ID] = struct{}{}
		}
	}
	return true
}

// mustResume fails the batch's messages not failed already: the producer is fenced, or a
// transaction's outcome is unknown, and only a resume can tell what Kafka holds.
func (p *TxPublisher) mustResume(results []broker.Result, idx []int, err error) []broker.Result {
	why := "its outcome is unknown until the relay resumes"
	if fenced(err) {
		why = "another producer took transactional id " + p.cfg.TransactionalID
	}
	p.ready = broker.Unavailable(fmt.Errorf("%w (%s): kafka: %w", broker.ErrFenced, why, err))
	for _, i := range idx {
		if results[i].Err == nil {
			results[i].Err = p.ready
		}
	}
	return results
}

// fenced reports whether Kafka refused the producer for a newer one.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// Marked implements broker.Ledger.
func (p *TxPublisher) Marked(ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.pending, id)
	}
}

// Features implements broker.Publisher. An event Kafka holds is not sent again while
// its row is unmarked: BrokerDedup, over that window.
func (p *TxPublisher) Features() broker.Features {
	return broker.Features{BrokerDedup: true, PerKeyOrdering: true, Headers: true, MaxMessageBytes: p.cfg.MaxMessageBytes}
}

// ValidateTopic implements broker.TopicValidator.
func (p *TxPublisher) ValidateTopic(topic string) error { return ValidateTopic(topic) }

// Close implements broker.Publisher. An open transaction is left to Kafka, which
// aborts it after the transaction timeout or when the next owner resumes.
func (p *TxPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cl != nil {
		p.cl.Close()
		p.cl = nil
	}
	p.ready = fmt.Errorf("%w: closed", broker.ErrFenced)
	return nil
}
