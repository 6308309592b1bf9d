package relay

import (
	"maps"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// dropReservedHeaders removes from each row the headers whose names the wire format
// reserves, in any letter case (wire.Reserved): a producer writing rows by plain SQL
// could otherwise send an Id, an Outbox-Seq or a Ce-Source beside the relay's own,
// and a consumer might believe the forged one. The event itself goes on. It returns
// how many it dropped and the first name, for the log.
func dropReservedHeaders(rows []outboxdriver.Row) (n int, first string) {
	for i := range rows {
		h := rows[i].Headers
		clean := true
		for k := range h {
			if !wire.RowHeaderAllowed(k) {
				clean = false
				break
			}
		}
		if clean {
			continue
		}
		kept := maps.Clone(h)
		for k := range h {
			if !wire.RowHeaderAllowed(k) {
				delete(kept, k)
				if n == 0 {
					first = k
				}
				n++
			}
		}
		rows[i].Headers = kept
	}
	return n, first
}
