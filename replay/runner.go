package replay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker"
)

// Runner runs one replay at a time in the background, for a long-running process
// (the dashboard of a relay): Start starts it, State says how far it got, Stop ends
// it (its checkpoint stands: started again under the same name, it continues).
type Runner struct {
	r        *Replayer
	pub      broker.Publisher
	defaults Config // Topic and Router, for a Config that gives none

	mu     sync.Mutex
	state  State
	cancel context.CancelFunc
	done   chan struct{}
}

// State is a Runner's current or last replay.
type State struct {
	Name      string
	Selection string
	Running   bool
	Stopped   bool // ended by Stop
	Progress  Progress
	Started   time.Time
	Finished  time.Time
	Result    Result
	Err       error
}

// NewRunner returns a Runner replaying r's history to pub; defaults (may be nil)
// gives the Topic and Router of a replay that names none (the relay's own).
func NewRunner(r *Replayer, pub broker.Publisher, defaults *Config) *Runner {
	rn := &Runner{r: r, pub: pub}
	if defaults != nil {
		rn.defaults = *defaults
	}
	return rn
}

// Start starts a replay of cfg in the background (cfg.Progress is the Runner's).
// ErrRunning when one runs already.
func (rn *Runner) Start(cfg *Config) error {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.state.Running {
		return ErrRunning
	}
	c := *cfg
	if c.Name == "" {
		c.Name = "default"
	}
	if c.Topic == nil {
		c.Topic = rn.defaults.Topic
	}
	if c.Router == nil {
		c.Router = rn.defaults.Router
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn.cancel, rn.done = cancel, make(chan struct{})
	rn.state = State{Name: c.Name, Selection: c.Filter.String(), Running: true, Started: time.Now()}
	c.Progress = func(p Progress) {
		rn.mu.Lock()
		rn.state.Progress = p
		rn.mu.Unlock()
	}
	done := rn.done
	go func() {
		defer close(done)
		defer cancel()
		res, err := rn.r.Run(ctx, rn.pub, &c)
		rn.mu.Lock()
		defer rn.mu.Unlock()
		rn.state.Running, rn.state.Finished, rn.state.Result = false, time.Now(), res
		if err != nil && !(rn.state.Stopped && errors.Is(err, context.Canceled)) {
			rn.state.Err = err
		}
	}()
	return nil
}

// State reports the current or last replay.
func (rn *Runner) State() State {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.state
}

// Stop ends the running replay, if any, and waits for it to end (or ctx).
func (rn *Runner) Stop(ctx context.Context) {
	rn.mu.Lock()
	cancel, done := rn.cancel, rn.done
	if rn.state.Running {
		rn.state.Stopped = true
	}
	rn.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
