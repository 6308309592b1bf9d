package relayprom

import (
	"context"
	"sync"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// StatusReader reads an outbox table's status (an outboxdriver.Store does).
type StatusReader interface {
	Status(ctx context.Context) (*outboxdriver.Status, error)
}

// StatusCacheIntervalDefault is how long NewStatusCache keeps a status by default.
const StatusCacheIntervalDefault = 10 * time.Second

// StatusCache keeps the last status read for Interval, so a scraper or a load
// balancer probing /metrics and /readyz cannot load the database: however many
// requests come, at most one status query runs per interval (concurrent callers
// share it). A failed read is kept too, for the same interval.
type StatusCache struct {
	src      StatusReader
	interval time.Duration
	now      func() time.Time

	mu     sync.Mutex // held while reading: callers wait for the read in flight
	at     time.Time
	st     *outboxdriver.Status
	err    error
	reads  int64
	filled bool
}

// NewStatusCache reads through src at most once per interval (0: the default).
func NewStatusCache(src StatusReader, interval time.Duration) *StatusCache {
	if interval <= 0 {
		interval = StatusCacheIntervalDefault
	}
	return &StatusCache{src: src, interval: interval, now: time.Now}
}

// Status implements StatusReader.
func (c *StatusCache) Status(ctx context.Context) (*outboxdriver.Status, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.filled && c.now().Sub(c.at) < c.interval {
		return c.st, c.err
	}
	c.reads++
	c.st, c.err = c.src.Status(ctx)
	c.at, c.filled = c.now(), true
	return c.st, c.err
}

// Reads is how many times the cache read its source.
func (c *StatusCache) Reads() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}
