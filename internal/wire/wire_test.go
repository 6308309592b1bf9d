package wire

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHeaderRules(t *testing.T) {
	for name, ok := range map[string]bool{
		"correlationId": true, "x-custom_1.2": true, "a!#$%&'*+-.^_`|~z": true,
		"": false, "a b": false, "a:b": false, "ключ": false, "a\nb": false, strings.Repeat("n", 256): false,
	} {
		if got := HeaderNameProblem(name) == ""; got != ok {
			t.Errorf("header name %q: accepted=%v, want %v", name, got, ok)
		}
	}
	for value, ok := range map[string]bool{
		"": true, "plain": true, "tab\there": true, "ключ": true,
		"a\r\nforged: 1": false, "\x1b[2K": false, "\x7f": false, "\xff": false,
	} {
		if got := HeaderValueProblem(value) == ""; got != ok {
			t.Errorf("header value %q: accepted=%v, want %v", value, got, ok)
		}
	}
}
