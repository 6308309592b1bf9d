package broker

import "context"

// Topics are a publisher's topic rules that need no connection: what Lazy answers
// for TopicEscaper and TopicValidator before its publisher exists. Nil fields escape
// nothing and accept every topic.
type Topics struct {
	Escape   func(token string) string
	Validate func(topic string) error
}

// Lazy is a publisher whose broker may be down when the relay starts: it dials on
// first use, and again (backing off as Conn does) until a dial succeeds, then hands
// every call to that publisher, which redials on its own after that. Until then each
// message's result is ErrUnavailable: the relay backs off, spends no attempt, and
// reports the broker down, as it does for an outage mid-run, instead of exiting at
// start (a crash loop under a supervisor while the broker is away).
type Lazy struct {
	conn   *Conn[Publisher]
	topics Topics
}

// NewLazy returns a Lazy that dials with dial.
func NewLazy(dial func(ctx context.Context) (Publisher, error), topics Topics) *Lazy {
	return &Lazy{conn: NewConn(dial, func(Publisher) bool { return false }, func(p Publisher) { _ = p.Close() }), topics: topics}
}

// Publish implements Publisher.
func (l *Lazy) Publish(ctx context.Context, msgs []Message) []Result {
	p, err := l.conn.Get(ctx)
	if err != nil {
		res := make([]Result, len(msgs))
		for i := range res {
			res[i].Err = err
		}
		return res
	}
	return p.Publish(ctx, msgs)
}

// Ready reports whether the publisher exists, dialing it (within ctx) if the last
// dial's backoff is over: nil once it does, else why not (ErrUnavailable).
func (l *Lazy) Ready(ctx context.Context) error {
	_, err := l.conn.Get(ctx)
	return err
}

// Features implements Publisher: the dialed publisher's, none before.
func (l *Lazy) Features() Features {
	if p, ok := l.conn.Current(); ok {
		return p.Features()
	}
	return Features{}
}

// Close implements Publisher.
func (l *Lazy) Close() error {
	l.conn.Close()
	return nil
}

// EscapeTopicToken implements TopicEscaper with Topics.Escape.
func (l *Lazy) EscapeTopicToken(s string) string {
	if l.topics.Escape == nil {
		return s
	}
	return l.topics.Escape(s)
}

// ValidateTopic implements TopicValidator with Topics.Validate.
func (l *Lazy) ValidateTopic(topic string) error {
	if l.topics.Validate == nil {
		return nil
	}
	return l.topics.Validate(topic)
}
