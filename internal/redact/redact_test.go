package redact

import (
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
