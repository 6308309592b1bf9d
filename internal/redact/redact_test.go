package redact

import (
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:hunter2@db:5432/x":              "postgres://u:***@db:5432/x",
		"postgres://u@db/x":                           "postgres://u@db/x",
		"nats://127.0.0.1:4222":                       "nats://127.0.0.1:4222",
		"kafka://u:p%40ss@h1:9092,h2:9092?sasl=plain": "kafka://u:***@h1:9092,h2:9092?sasl=plain",
		"amqp://u:pw@host:5672/%zz":                   "amqp://u:***@host:5672/%zz",
		"postgres://admin:hun/ter2@host/db":           "postgres://admin:***@host/db",
		"postgres://admin:a@b?c#d@host/db?x=1":        "postgres://admin:***@host/db?x=1",
		"host=db password=hunter2 user=x":             "host=db password=*** user=x",
		"host=db password='hun ter2' user=x":          "host=db password=*** user=x",
		"postgres://db/x?sslmode=require&password=pw": "postgres://db/x?sslmode=require&password=***",
		"root:s3cret@tcp(127.0.0.1:3306)/test":        "root:***@tcp(127.0.0.1:3306)/test",
		`--db "postgres://u:pw@h/d": bad`:             `--db "postgres://u:***@h/d": bad`,
		"no secret here: a=b":                         "no secret here: a=b",
	} {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzString: a password, made of any characters including every URL-reserved one, in
// a URL's user info, a key=value DSN or a MySQL DSN, never survives.
func FuzzString(f *testing.F) {
	f.Add("postgres", "u", "hunter2", "db:5432/x")
	f.Add("amqp", "guest", "p@ss:w/rd?#%", "host/%zz")
	f.Add("nats", "u", "a/b@c:d", "h:4222")
	f.Fuzz(func(t *testing.T, scheme, user, pw, rest string) {
		if strings.IndexFunc(scheme+user+rest, unicode.IsSpace) >= 0 {
			return
		}
		if len(pw) < 4 || strings.IndexFunc(pw, unicode.IsSpace) >= 0 || strings.ContainsAny(pw, "\"'") || strings.ContainsAny(user, ":@/?# \t\n\"'") || user == "" ||
			strings.ContainsAny(rest, "@ \t\n\"'") || strings.ContainsAny(scheme, ":/ \t\n\"'") ||
			strings.Contains(scheme+"|"+user+"|"+rest+"|host=password=user=dbname=x|tcp(h:3306)/db", pw) {
			return
		}
		for _, raw := range []string{
			scheme + "://" + user + ":" + pw + "@" + rest,
			"host=" + rest + " password=" + pw + " user=" + user,
			"dbname=x password='" + strings.ReplaceAll(pw, "'", `\'`) + "'",
		} {
			if out := String(raw); strings.Contains(out, pw) {
				t.Fatalf("String(%q) = %q keeps the password", raw, out)
			}
		}
		if !strings.ContainsAny(pw, "()") {
			raw := user + ":" + pw + "@tcp(" + "h:3306)/db"
			if out := String(raw); strings.Contains(out, pw) {
				t.Fatalf("String(%q) = %q keeps the password", raw, out)
			}
		}
	})
}

// TestValues: a flag's value (a URL or DSN) keeps no password however it is written,
// and Passwords finds what a driver may quote of it.
func TestValues(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pa'ss@127.0.0.1:1/x":                              "postgres://u:***@127.0.0.1:1/x",
		`postgres://u:pa"ss@127.0.0.1:1/x`:                              "postgres://u:***@127.0.0.1:1/x",
		"postgres://u:pa ss@127.0.0.1:1/x":                              "postgres://u:***@127.0.0.1:1/x",
		"postgres://u:p@ss@127.0.0.1:1/x":                               "postgres://u:***@127.0.0.1:1/x",
		"u:pw-secret@host/db":                                           "u:***@host/db",
		"postgres://app@db:5432/app":                                    "postgres://app@db:5432/app",
		"https://h/x?api_key=k1&access_token=t2&client_secret=s3&sig=z": "https://h/x?api_key=***&access_token=***&client_secret=***&sig=***",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
	pws := Passwords("postgres://u:hunter@2secret@127.0.0.1:1/x")
	for _, want := range []string{"hunter@2secret", "hunter", "2secret"} {
		if !slices.Contains(pws, want) {
			t.Errorf("Passwords: %q lacks %q", pws, want)
		}
	}
	for in, want := range map[string]string{
		"nats://SECRETTOKEN@nats:4222":                       "nats://nats:4222",
		"nats://u:pw@n1:4222,n2:4222":                        "nats://n1:4222,n2:4222",
		"https://hooks.example.com/services/T0/B0/XXXSECRET": "https://hooks.example.com/…",
		"https://h.example/hook?api_key=k":                   "https://h.example/…",
		"kafka://k1:9092,k2:9092":                            "kafka://k1:9092,k2:9092",
		"stdout:":                                            "stdout:",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}
