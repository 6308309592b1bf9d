package version

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInfo(t *testing.T) {
	i := Get()
	if i.Version == "" || !strings.HasPrefix(i.Go, "go") {
		t.Fatalf("build info: %+v", i)
	}
	for _, tc := range []struct {
		in   Info
		want string
	}{
		{Info{}, "unknown"},
		{Info{Revision: "0123456789abcdef"}, "0123456789ab"},
		{Info{Revision: "0123456789abcdef", Modified: true}, "0123456789ab+dirty"},
	} {
		if got := tc.in.Short(); got != tc.want {
			t.Errorf("%+v.Short() = %q, want %q", tc.in, got, tc.want)
		}
	}
	if s := (Info{Version: "v1.2.3", Go: "go1.26.0"}).String(); !strings.HasPrefix(s, "outbox v1.2.3 (revision unknown, go1.26.0 ") {
		t.Fatalf("String() = %q", s)
	}
}
