package relayprom

import "github.com/prometheus/client_golang/prometheus"

// RetiredTables is outbox_relay_table_retired, reported by a relay of many tables
// (`outbox relay --tables`) for a table it let go on purpose: dropped, or no longer
// matching. The table's other series vanish then, and the alert rules leave such a
// table out of "every relay of a table vanished".
type RetiredTables struct{ g *prometheus.GaugeVec }

// NewRetiredTables registers outbox_relay_table_retired on reg.
func NewRetiredTables(reg prometheus.Registerer) (*RetiredTables, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_relay_table_retired",
		Help: "1 for a table this relay let go on purpose (dropped, or no longer matching --tables): its other series vanished on purpose."},
		[]string{"table"})
	if err := reg.Register(g); err != nil {
		return nil, err
	}
	return &RetiredTables{g: g}, nil
}

// Retire reports table as let go.
func (r *RetiredTables) Retire(table string) { r.g.WithLabelValues(table).Set(1) }

// Forget drops table's series (relayed again, or retired long enough ago).
func (r *RetiredTables) Forget(table string) { r.g.DeleteLabelValues(table) }
