package outboxdriver_test

import (
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/outboxdriver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseValue: each type's text output (as ::text gives it, DateStyle ISO) reads
// back as the Go value Value documents; what does not parse stays its text.
func TestParseValue(t *testing.T) {
	ts := time.Date(2019, 1, 31, 12, 13, 1, 123456000, time.UTC)
	for _, tc := range []struct {
		typ, text string
		want      any
	}{
		{"integer", "1232", int64(1232)},
		{"bigint", "-9223372036854775808", int64(-9223372036854775808)},
		{"boolean", "true", true},
		{"boolean", "f", false},
		{"double precision", "4.9", 4.9},
		{"text", "acme", "acme"},
		{"timestamp without time zone", "2019-01-31 12:13:01.123456", ts},
		{"timestamp with time zone", "2019-01-31 13:13:01.123456+01", ts},
		{"timestamp with time zone", "2019-01-31 17:43:01.123456+05:30", ts},
		{"date", "2019-01-31", time.Date(2019, 1, 31, 0, 0, 0, 0, time.UTC)},
		{"bytea", `\x00ff`, []byte{0, 0xff}},
		{"timestamp without time zone", "infinity", "infinity"},
		{"numeric", "1.50", "1.50"},
	} {
		text := tc.text
		got := outboxdriver.ParseValue(tc.typ, &text)
		if got.Type != tc.typ || !reflect.DeepEqual(got.V, tc.want) {
			if gt, ok := got.V.(time.Time); !ok || !gt.Equal(tc.want.(time.Time)) {
				t.Errorf("%s %q: got %#v, want %#v", tc.typ, tc.text, got.V, tc.want)
			}
		}
	}
	if v := outboxdriver.ParseValue("integer", nil); v.V != nil || v.Type != "integer" {
		t.Errorf("NULL: %#v", v)
	}
}
