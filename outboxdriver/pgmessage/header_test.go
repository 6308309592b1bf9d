package pgmessage

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// FuzzMessageHeader checks the header fast path against encoding/json: whenever it
// accepts an input, it must read exactly what json.Unmarshal reads.
func FuzzMessageHeader(f *testing.F) {
	f.Add([]byte(`{"id":"x","aggregatetype":"order","aggregateid":"1","type":"T","headers":{"a":"b"},"payload_null":true}`))
	f.Add([]byte(`{"id":"x","created_at":"2026-01-02T03:04:05.123Z","available_at":"2026-01-02T03:04:05+02:00"}`))
	f.Add([]byte(` { "ID" : "é\u00e9" , "type":"\n" } `))
	f.Add([]byte(`{"headers":{"a":"1"},"headers":{"b":"2"}}`))
	f.Add([]byte(`{"seq":12,"id":"x","aggregatetype":"order"}`))
	f.Add([]byte(`{"seq":0123}`))
	f.Add([]byte(`{"seq":1e3,"seq":999999999999999999}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast messageHeader
		if !fast.parseSimple(b) {
			return
		}
		var slow messageHeader
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatalf("fast path accepted what encoding/json refuses (%v): %q", err, b)
		}
		if !reflect.DeepEqual(normalize(fast), normalize(slow)) {
			t.Fatalf("fast %+v, encoding/json %+v for %q", fast, slow, b)
		}
	})
}

// normalize makes times comparable (the same instant, whatever the location).
func normalize(h messageHeader) messageHeader {
	for _, p := range []**time.Time{&h.CreatedAt, &h.AvailableAt} {
		if *p != nil {
			t := (*p).UTC()
			*p = &t
		}
	}
	return h
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
