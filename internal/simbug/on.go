//go:build simbug

package simbug

import "os"

// On reports whether the named planted bug is on: the one OUTBOX_SIMBUG names.
func On(name string) bool { return os.Getenv("OUTBOX_SIMBUG") == name }
