// Package failpoint is the relay's fault injection for crash tests and the demo: the
// relay and the CDC source call a hook at named points (relay.FailpointAfterClaim,
// relay.FailpointAfterPublish, pgcdc.FailpointAfterReceive), and FromEnv makes that
// hook kill the process where OUTBOX_FAILPOINT says. Nothing here runs unless the
// variable is set.
package failpoint

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// FromEnv reads OUTBOX_FAILPOINT, for crash tests and the demo only. With
// "name:n" the process kills itself with SIGKILL the n-th time it reaches that point;
// with "name@FILE", the first time it reaches it after FILE exists. With "name:n:stop"
// it stops (SIGSTOP) instead, as a pause would, until the test sends SIGCONT.
func FromEnv() func(string) {
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
