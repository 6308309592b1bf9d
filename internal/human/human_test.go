package human

import (
	"testing"
	"time"
)

func TestHuman(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Bytes(12), "12 B"}, {Bytes(1536), "1.5 KiB"}, {Bytes(3 << 20), "3.0 MiB"}, {Bytes(5 << 30), "5.0 GiB"},
		{Ranges(nil), "[]"}, {Ranges([]int{0, 1, 2, 3, 8, 10, 11}), "[0-3,8,10-11]"},
		{Age(0), "0s"}, {Age(850 * time.Millisecond), "850ms"}, {Age(200 * time.Second), "3m 20s"},
		{Age(5*time.Hour + 12*time.Minute), "5h 12m"}, {Age(76 * time.Hour), "3d 4h"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
