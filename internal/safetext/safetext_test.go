package safetext

import (
	"encoding/json"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDisplay(t *testing.T) {
	for in, want := range map[string]string{
		"order-42":          "order-42",
		"evil\u202egnp.exe": `evil\u202egnp.exe`,
		"a\x1b]0;owned\x07": `a\x1b]0;owned\x07`,
		"c1\u009bx\u0085":   `c1\u009bx\u0085`,
		"del\x7f":           `del\x7f`,
		"line\u2028sep":     `line\u2028sep`,
		`back\slash`:        `back\\slash`,
		"bad\xffutf8":       `bad\xffutf8`,
		"日本語":               "日本語",
	} {
		if got := Display(in); got != want {
			t.Errorf("Display(%q) = %q, want %q", in, got, want)
		}
	}
	if got := Cell("abcdefghij", 5); got != "abcd…" {
		t.Errorf("Cell = %q", got)
	}
}

func TestJSON(t *testing.T) {
	in := map[string]string{"id": "evil\u202egnp.exe", "c1": "x\u009by\x7f", "plain": "ok"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(b)
	for _, r := range string(got) {
		if r >= 0x7f && acts(r) {
			t.Fatalf("JSON left %U in %s", r, got)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["id"] != in["id"] || back["c1"] != in["c1"] {
		t.Fatalf("escaped JSON decodes to %q (%v), want %q", back, err, in)
	}
}

func FuzzJSON(f *testing.F) {
	f.Add("evil\u202egnp.exe")
	f.Fuzz(func(t *testing.T, s string) {
		b, _ := json.Marshal(s)
		var back string
		if err := json.Unmarshal(JSON(b), &back); err != nil {
			t.Fatalf("JSON(%q) no longer decodes: %v", b, err)
		}
		var want string
		_ = json.Unmarshal(b, &want)
		if back != want {
			t.Fatalf("JSON changed the value: %q != %q", back, want)
		}
	})
}
