// Package redact hides passwords in URLs and DSNs before they reach an error message
// or a log line.
package redact

import "strings"

// URL returns raw with the password of its user info replaced by ***. Strings that
// are not URLs with user info come back unchanged.
func URL(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return raw
	}
	start := i + 3
	end := len(raw)
	if j := strings.IndexAny(raw[start:], "/?#"); j >= 0 {
		end = start + j
	}
	authority := raw[start:end]
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return raw
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return raw
	}
	return raw[:start] + user + ":***" + raw[start+at:]
}
