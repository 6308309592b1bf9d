// Package testname makes names for tests' own schemas, streams, topics and
// exchanges. A leaf: the broker suite uses it without pulling in a database client.
package testname

import (
	"crypto/rand"
	"encoding/hex"
)

// Unique returns prefix plus random lowercase hex.
func Unique(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
