// Package safetext renders untrusted text (event fields, errors quoting them) for
// people: terminals, JSON read in a terminal, web pages and metric labels. It is the
// one renderer every output uses, so a row can neither retitle a terminal, forge a
// line, nor show a name that reads as something else (a right-to-left override turns
// "evil\u202egnp.exe" into "evilexe.png" on screen).
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Display returns s with every rune that would act on the display instead of
// showing shown escaped: control characters (C0, DEL, C1) as \xNN or \uNNNN,
// bidirectional controls and the line and paragraph separators as \uNNNN, invalid
// UTF-8 as \xNN, and the backslash as \\ (so an escape cannot be forged).
func Display(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case acts(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// acts reports whether r acts on the display rather than showing: a control
// character, a bidirectional control, or the line and paragraph separators.
func acts(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}

func needsEscape(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return true
			}
		}
		if r == '\\' || acts(r) {
			return true
		}
	}
	return false
}

// Cell is Display cut to at most n runes (with "…"), for a column of a table: one
// long value must not push every row off the screen.
func Cell(s string, n int) string {
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return Display(s)
}

// LogMax is how much of a row's value a log line shows (Log).
const LogMax = 200

// Log is a row's value for a log line: cut to LogMax bytes, on a rune boundary,
// saying how long it was. A row may hold a megabyte of key; a line per event must not.
// (The log handler escapes what acts on a terminal.)
func Log(s string) string {
	if len(s) <= LogMax {
		return s
	}
	cut := LogMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// JSON escapes, inside encoded JSON, the runes Display escapes that encoding/json
// leaves as they are (DEL, C1 controls, bidirectional controls) as \uNNNN: the same
// values, JSON-equal, that a terminal shows as written.
func JSON(b []byte) []byte {
	if !needsJSONEscape(b) {
		return b
	}
	var out strings.Builder
	s := string(b)
	for _, r := range s {
		if r >= 0x7f && acts(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
			continue
		}
		out.WriteRune(r)
	}
	return []byte(out.String())
}

func needsJSONEscape(b []byte) bool {
	for _, r := range string(b) {
		if r >= 0x7f && acts(r) {
			return true
		}
	}
	return false
}
