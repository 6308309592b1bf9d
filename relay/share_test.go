package relay

import (
	"fmt"
	"slices"
	"testing"
)

// owners is every partition's owner by id, as each member works out its own share.
func owners(t *testing.T, relays []string, partitions int) []string {
	t.Helper()
	out := make([]string, partitions)
	limit := (partitions + len(relays) - 1) / len(relays)
	for me, id := range relays {
		mine := share(relays, me, partitions)
		if len(mine) > limit {
			t.Fatalf("%d relays, %d partitions: %s owns %d, more than %d", len(relays), partitions, id, len(mine), limit)
		}
		for _, p := range mine {
			if out[p] != "" {
				t.Fatalf("%d relays, %d partitions: partition %d owned by %s and %s", len(relays), partitions, p, out[p], id)
			}
			out[p] = id
		}
	}
	for p, id := range out {
		if id == "" {
			t.Fatalf("%d relays, %d partitions: partition %d owned by none", len(relays), partitions, p)
		}
	}
	return out
}

func movedBetween(a, b []string) int {
	n := 0
	for p := range a {
		if a[p] != b[p] {
			n++
		}
	}
	return n
}

// TestShareMovesLittle: each partition has one owner and no share passes
// ceil(partitions/n); a relay joining moves at most twice the partitions it should
// take, a relay leaving at most twice those it held (partition p to member p mod n
// moved most of them: 46 of 64 from three relays to four).
func TestShareMovesLittle(t *testing.T) {
	for _, partitions := range []int{64, 256} {
		for n := 1; n <= 8; n++ {
			var relays []string
			for i := range n {
				relays = append(relays, fmt.Sprintf("host-%d-%x", i, i*7919))
			}
			slices.Sort(relays)
			before := owners(t, relays, partitions)

			joined := append(slices.Clone(relays), "host-new")
			slices.Sort(joined)
			take := (partitions + n) / (n + 1)
			if moved := movedBetween(before, owners(t, joined, partitions)); moved > 2*take {
				t.Errorf("%d partitions, %d relays, one joins: %d partitions moved; the newcomer's share is %d", partitions, n, moved, take)
			}
			if n == 1 {
				continue
			}
			for gone := range relays {
				left := slices.Delete(slices.Clone(relays), gone, gone+1)
				held := 0
				for _, id := range before {
					if id == relays[gone] {
						held++
					}
				}
				if moved := movedBetween(before, owners(t, left, partitions)); moved > 2*held {
					t.Errorf("%d partitions, %d relays, %s leaves: %d partitions moved; it held %d", partitions, n, relays[gone], moved, held)
				}
			}
		}
	}
}

// TestShareOfNonMember: a relay not (yet) in the list owns nothing.
func TestShareOfNonMember(t *testing.T) {
	if got := share([]string{"a", "b"}, -1, 64); got != nil {
		t.Fatalf("share of a non-member: %v", got)
	}
}
