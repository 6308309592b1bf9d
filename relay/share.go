package relay

import (
	"encoding/binary"
	"hash/fnv"
)

// share is the partitions the group member relays[me] owns, out of partitions, when
// relays are the live members (every member reads the same list). Each partition, in
// order, goes to the member it ranks first among those holding fewer than
// ceil(partitions/n) so far; a partition ranks the members by a weight of the pair
// (rendezvous hashing). So no share exceeds ceil(partitions/n), every member works out
// the same shares, and a member joining or leaving moves about the partitions it takes
// or held, not most of them as partition p to member p mod n did (each move costs a
// handover: a barrier and the batch in flight). TestShareMovesLittle measures it.
func share(relays []string, me, partitions int) []int {
	n := len(relays)
	if me < 0 || me >= n {
		return nil
	}
	limit := (partitions + n - 1) / n
	load := make([]int, n)
	var mine []int
	for p := range partitions {
		best, bestWeight := -1, uint64(0)
		for i, id := range relays {
			if w := shareWeight(p, id); load[i] < limit && (best < 0 || w > bestWeight) {
				best, bestWeight = i, w
			}
		}
		load[best]++
		if best == me {
			mine = append(mine, p)
		}
	}
	return mine
}

// shareWeight is partition p's weight for the member id: FNV-1a of the two, then
// SplitMix64's finalizer, as FNV alone mixes the last bytes poorly.
func shareWeight(p int, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	_, _ = h.Write(binary.BigEndian.AppendUint32([]byte{0}, uint32(p)))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
