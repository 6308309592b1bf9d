//go:build !linux

package main

import "time"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is Linux's own: keepalives
// still find an idle connection dead.
func setUserTimeout(uintptr, time.Duration) error { return nil }
