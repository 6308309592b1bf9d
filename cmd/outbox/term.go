package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// termSafe makes a value from the database safe to print on a terminal: control
// characters (ESC, BEL, CR, ...), bidirectional overrides and invalid UTF-8 are shown
// escaped (\x1b, \u202e), so an event field can neither retitle the terminal nor forge
// a line of the table. Event fields are untrusted input.
func termSafe(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && (unicode.IsControl(r) || r == '\\'):
			if r == '\\' {
				b.WriteString(`\\`)
			} else {
				fmt.Fprintf(&b, `\x%02x`, r)
			}
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func needsEscape(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return true
			}
		}
		if r == '\\' || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return true
		}
	}
	return false
}
