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
// for word, from text that quotes them in another form). s taken as one value (a
// flag's), its user info's password counts too however it is written (quotes, white
// space, no scheme), and so does each '@'-separated piece of it: a driver that split
// the URL at an unescaped '@' quotes the rest as a host name.
func Passwords(s string) []string {
	var out []string
	if pw := valuePassword(s); pw != "" {
		out = append(out, pw)
		if pieces := strings.Split(pw, "@"); len(pieces) > 1 {
			out = append(out, pieces...)
		}
	}
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

// URL redacts one value: a URL or DSN given as a flag, whose password is hidden
// however it is written (with quotes or white space, an unescaped '@', or no scheme:
// user:password@host/db), then as String does.
func URL(s string) string {
	if pw := valuePassword(s); pw != "" {
		s = strings.Replace(s, ":"+pw+"@", ":***@", 1)
	}
	return String(s)
}

// valuePassword is the password of a value's user info: from the first ':' after
// the scheme (or the start, when there is none) to the value's last '@'.
func valuePassword(v string) string {
	start := 0
	if i := strings.Index(v, "://"); i >= 0 {
		start = i + 3
	} else if strings.ContainsAny(v, " \t\n") && !strings.Contains(v, "@") {
		return ""
	}
	at := strings.LastIndexByte(v[start:], '@')
	if at < 0 {
		return ""
	}
	user, pw, ok := strings.Cut(v[start:start+at], ":")
	if !ok || user == "" || strings.ContainsAny(user, "/?#@ \t\n") {
		return ""
	}
	return pw
}

// Endpoint shows where a broker or endpoint URL points, without anything that may be
// a secret: the scheme and the hosts, with "/…" for a path or query it had (a token
// in the user info, a webhook's secret path, ?api_key=). For logs and pages.
func Endpoint(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return String(s)
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		rest = rest[at+1:] // the user info, however written (an '@' later on cuts more, never less)
	}
	host, more := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		host = rest[:i]
		if strings.Trim(rest[i:], "/") != "" {
			more = "/…"
		}
	}
	return scheme + "://" + host + more
}

// keyValue matches a password-like key and its value in a key/value DSN (quoted, or
// up to white space); query matches one in a URL's query string (up to '&').
var (
	keyValue = regexp.MustCompile(`(?i)((?:^|[\s(,;])` + secretKey + `\s*=\s*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|\S+)`)
	query    = regexp.MustCompile(`(?i)([?&]` + secretKey + `=)([^&\s#]*)`)
)

// secretKey is a key whose value is a secret: password, secret, token, key,
// signature, credential and auth, alone or with a prefix (api_key, access_token,
// client_secret, X-Amz-Signature, sslpassword).
const secretKey = `(?:[a-z0-9_.-]*(?:password|passwd|pwd|secret|token|signature|credential|key)|pass|auth|sig|apikey)`

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
