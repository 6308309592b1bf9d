// Package redact hides passwords in URLs and DSNs before they reach an error message,
// a log line or a status output. It is the one redaction path of the project.
package redact

import (
	"regexp"
	"strings"
)

// String returns s with every password it can recognise replaced by ***: the password
// of a URL's user info (scheme://user:password@host, even with unescaped reserved
// characters in the password), a key=value password (password=..., pass=, pwd=,
// sslpassword=, secret=, quoted or not, in DSNs and query strings), and a MySQL
// driver DSN's (user:password@tcp(host)/db). Text without any comes back unchanged.
func String(s string) string {
	s = urlUserInfo(s)
	s = query.ReplaceAllString(s, "${1}***")
	s = keyValue.ReplaceAllString(s, "${1}***")
	return mysqlDSN.ReplaceAllString(s, "${1}${2}:***@${3}")
}

// Passwords returns the passwords String would hide in s (for scrubbing them, word
// for word, from text that quotes them in another form).
func Passwords(s string) []string {
	var out []string
	for _, m := range query.FindAllStringSubmatch(s, -1) {
		out = append(out, m[2])
	}
	for _, m := range keyValue.FindAllStringSubmatch(s, -1) {
		out = append(out, strings.Trim(m[2], `'"`))
	}
	for _, m := range mysqlDSN.FindAllStringSubmatchIndex(s, -1) {
		userEnd := m[5]
		at := strings.LastIndex(s[:m[6]], "@")
		if at > userEnd+1 {
			out = append(out, s[userEnd+1:at])
		}
	}
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		rest = rest[i+3:]
		end := len(rest)
		if j := strings.IndexAny(rest, " \t\n\"'"); j >= 0 {
			end = j
		}
		at := strings.LastIndexByte(rest[:end], '@')
		if at < 0 {
			continue
		}
		if user, pw, ok := strings.Cut(rest[:at], ":"); ok && !strings.ContainsAny(user, "/?#") {
			out = append(out, pw)
		}
	}
	return out
}

// Scrub replaces every occurrence of each secret (of at least 4 bytes) in s with ***.
func Scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "***")
		}
	}
	return s
}

// URL is String; the name says where it is used most.
func URL(s string) string { return String(s) }

// keyValue matches a password-like key and its value in a key/value DSN (quoted, or
// up to white space); query matches one in a URL's query string (up to '&').
var (
	keyValue = regexp.MustCompile(`(?i)((?:^|[\s(,;])(?:password|passwd|pass|pwd|sslpassword|secret|token)\s*=\s*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|\S+)`)
	query    = regexp.MustCompile(`(?i)([?&](?:password|passwd|pass|pwd|sslpassword|secret|token)=)([^&\s#]*)`)
)

// mysqlDSN matches go-sql-driver's user:password@protocol(address) form.
var mysqlDSN = regexp.MustCompile(`(^|[\s"'])([^\s:/@"']+):[^\s]*@((?:tcp|unix|udp)\()`)

// urlUserInfo redacts scheme://user:password@ up to the last '@' of the authority. A
// password may hold '/', '?', '#' and '@' unescaped (a hand-written DSN): the user
// info is taken to end at the last '@' before the next white space.
func urlUserInfo(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		start := i + 3
		end := len(s)
		if j := strings.IndexAny(s[start:], " \t\n\"'"); j >= 0 {
			end = start + j
		}
		rest := s[start:end]
		at := strings.LastIndexByte(rest, '@')
		user, _, hasPassword := strings.Cut(rest[:max(at, 0)], ":")
		if at < 0 || !hasPassword || strings.ContainsAny(user, "/?#") {
			b.WriteString(s[:start])
			s = s[start:]
			continue
		}
		b.WriteString(s[:start] + user + ":***")
		s = s[start+at:]
	}
}
