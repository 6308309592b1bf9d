package redact

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:hunter2@db:5432/x":              "postgres://u:***@db:5432/x",
		"postgres://u@db/x":                           "postgres://u@db/x",
		"nats://127.0.0.1:4222":                       "nats://127.0.0.1:4222",
		"kafka://u:p%40ss@h1:9092,h2:9092?sasl=plain": "kafka://u:***@h1:9092,h2:9092?sasl=plain",
		"amqp://u:pw@host:5672/%zz":                   "amqp://u:***@host:5672/%zz",
		"host=db password=x":                          "host=db password=x",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzURL: a password in a URL's user info never survives.
func FuzzURL(f *testing.F) {
	f.Add("postgres", "u", "hunter2", "db:5432/x")
	f.Add("amqp", "guest", "p@ss:w/rd", "host/%zz")
	f.Fuzz(func(t *testing.T, scheme, user, pw, rest string) {
		if len(pw) < 4 || strings.ContainsAny(pw+user, "@/?#:") || strings.ContainsAny(rest, "@") {
			return // not a URL with a recognisable user:password@ part
		}
		raw := scheme + "://" + user + ":" + pw + "@" + rest
		if out := URL(raw); strings.Contains(out, ":"+pw+"@") {
			t.Fatalf("URL(%q) = %q keeps the password", raw, out)
		}
	})
}
