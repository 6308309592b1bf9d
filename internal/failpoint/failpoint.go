// Package failpoint is the project's fault injection, for crash tests and the demo,
// as etcd's gofail is: the relay, the CDC source and the Kafka publisher call Hit at
// the named points below, and a process started with OUTBOX_FAILPOINT naming one
// kills (or stops) itself there. Nothing happens unless the variable is set. The
// points live here, not in the packages' public configs: they are the tests' business.
package failpoint

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// The points.
const (
	// RelayAfterClaim: a batch claimed, nothing published yet.
	RelayAfterClaim = "relay.after-claim"
	// RelayAfterPublish: a batch published, its rows not marked yet.
	RelayAfterPublish = "relay.after-publish-before-mark"
	// RelayAfterMark: a batch's rows marked.
	RelayAfterMark = "relay.after-mark"
	// WALAfterReceive: a CDC event queued, not published yet.
	WALAfterReceive = "wal.after-receive-before-publish"
	// WALAfterMark: a CDC batch's rows completed, the slot's position not reported yet.
	WALAfterMark = "wal.after-mark-before-confirm"
	// KafkaBeforeCommit: a batch's records and its progress record produced and
	// flushed, the Kafka transaction not committed yet.
	KafkaBeforeCommit = "kafka.before-commit"
)

// hook is the process's, read from its environment once. It is process-wide
// state, as the environment variable that sets it is.
var hook = sync.OnceValue(fromEnv)

// Hit is called at point: it kills or stops the process there if OUTBOX_FAILPOINT
// says so, and does nothing otherwise.
func Hit(point string) {
	if h := hook(); h != nil {
		h(point)
	}
}

// fromEnv reads OUTBOX_FAILPOINT, for crash tests and the demo only. With
// "name:n" the process kills itself with SIGKILL the n-th time it reaches that point;
// with "name@FILE", the first time it reaches it after FILE exists. With "name:n:stop"
// it stops (SIGSTOP) instead, as a pause would, until the test sends SIGCONT.
func fromEnv() func(string) {
	spec := os.Getenv("OUTBOX_FAILPOINT")
	if spec == "" {
		return nil
	}
	kill := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the signal is on its way
	}
	if name, file, ok := strings.Cut(spec, "@"); ok {
		return func(point string) {
			if point == name {
				if _, err := os.Stat(file); err == nil {
					kill()
				}
			}
		}
	}
	name, nth, _ := strings.Cut(spec, ":")
	nth, action, _ := strings.Cut(nth, ":")
	n, err := strconv.Atoi(nth)
	if err != nil || n < 1 {
		n = 1
	}
	if action == "stop" {
		kill = func() {
			// Sent to this thread, the stop takes it before it returns from the
			// call: nothing after the failpoint runs until SIGCONT.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
		}
	}
	var hits atomic.Int64
	return func(point string) {
		if point == name && hits.Add(1) == int64(n) {
			kill()
		}
	}
}
