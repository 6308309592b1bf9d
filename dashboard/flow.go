package dashboard

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxd/outbox/outboxdriver"
)

// The relay metrics the flow charts read (relay/relayprom).
const (
	metricPublished = "outbox_relay_published_total"
	metricFailed    = "outbox_relay_failed_total"
	metricLatency   = "outbox_relay_commit_to_ack_seconds"
)

// reading is what one sample takes from the relays' metrics, summed over every
// relay and topic.
type reading struct {
	published, failed float64
	buckets           []bucket // cumulative, by upper bound
}

type bucket struct {
	upper float64
	count float64
}

// sample is the state at one moment.
type sample struct {
	at        time.Time
	status    *outboxdriver.Status // nil when the database did not answer
	statusErr error
	flow      *reading // nil without metrics, or when they could not be read
}

// history keeps the last samples, oldest first.
type history struct {
	mu      sync.Mutex
	max     int
	samples []sample
}

func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, s)
	if over := len(h.samples) - h.max; over > 0 {
		h.samples = append(h.samples[:0], h.samples[over:]...)
	}
}

func (h *history) snapshot() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.samples...)
}

// point is one value of a chart.
type point struct {
	at time.Time
	v  float64
}

// flowSeries derives, for each interval between two samples with metrics, the
// events published per second and the commit→broker p50 and p99 of the events
// acknowledged in it. A counter that went down (a relay restarted) gives no point.
func flowSeries(ss []sample) (rate, p50, p99 []point) {
	var prev *sample
	for i := range ss {
		s := &ss[i]
		if s.flow == nil {
			continue
		}
		if prev != nil {
			dt := s.at.Sub(prev.at).Seconds()
			d := s.flow.published - prev.flow.published
			if dt > 0 && d >= 0 {
				rate = append(rate, point{s.at, d / dt})
				if delta := subBuckets(s.flow.buckets, prev.flow.buckets); delta != nil {
					if q, ok := quantile(0.5, delta); ok {
						p50 = append(p50, point{s.at, q})
					}
					if q, ok := quantile(0.99, delta); ok {
						p99 = append(p99, point{s.at, q})
					}
				}
			}
		}
		prev = s
	}
	return rate, p50, p99
}

// subBuckets is the histogram of what happened between two readings; nil when the
// bucket layouts differ or a count went down.
func subBuckets(now, before []bucket) []bucket {
	if len(now) != len(before) {
		return nil
	}
	out := make([]bucket, len(now))
	for i := range now {
		if now[i].upper != before[i].upper || now[i].count < before[i].count {
			return nil
		}
		out[i] = bucket{now[i].upper, now[i].count - before[i].count}
	}
	return out
}

// quantile estimates the q-quantile of a cumulative histogram by linear
// interpolation inside the bucket that holds it, as PromQL's histogram_quantile
// does. ok is false for an empty histogram.
func quantile(q float64, bs []bucket) (float64, bool) {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0, false
	}
	total := bs[len(bs)-1].count
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.upper, 1) {
				return lower, true // past the last finite bound: say the bound
			}
			if b.count == below {
				return b.upper, true
			}
			return lower + (b.upper-lower)*(rank-below)/(b.count-below), true
		}
		lower, below = b.upper, b.count
	}
	return lower, true
}

// readFlow sums the relay metrics of every family set.
func readFlow(sets ...[]*dto.MetricFamily) *reading {
	r := &reading{}
	byUpper := map[float64]float64{}
	for _, fams := range sets {
		for _, f := range fams {
			switch f.GetName() {
			case metricPublished:
				for _, m := range f.GetMetric() {
					r.published += m.GetCounter().GetValue()
				}
			case metricFailed:
				for _, m := range f.GetMetric() {
					r.failed += m.GetCounter().GetValue()
				}
			case metricLatency:
				for _, m := range f.GetMetric() {
					h := m.GetHistogram()
					inf := false
					for _, b := range h.GetBucket() {
						byUpper[b.GetUpperBound()] += float64(b.GetCumulativeCount())
						inf = inf || math.IsInf(b.GetUpperBound(), 1)
					}
					if !inf { // the registry leaves the +Inf bucket implicit
						byUpper[math.Inf(1)] += float64(h.GetSampleCount())
					}
				}
			}
		}
	}
	for u, c := range byUpper {
		r.buckets = append(r.buckets, bucket{u, c})
	}
	sort.Slice(r.buckets, func(i, j int) bool { return r.buckets[i].upper < r.buckets[j].upper })
	return r
}

// flowSource reads the relays' metrics: a registry in this process, relays'
// /metrics endpoints, or both.
type flowSource struct {
	gatherer prometheus.Gatherer
	urls     []string
	client   *http.Client
	// table keeps, of series that carry a table label, only this table's: a relay of
	// many tables reports them all in one registry.
	table string
}

func (f *flowSource) enabled() bool { return f.gatherer != nil || len(f.urls) > 0 }

func (f *flowSource) read(ctx context.Context) (*reading, error) {
	var sets [][]*dto.MetricFamily
	if f.gatherer != nil {
		fams, err := f.gatherer.Gather()
		if err != nil {
			return nil, fmt.Errorf("relay metrics: %w", err)
		}
		sets = append(sets, f.ofTable(fams))
	}
	for _, u := range f.urls {
		fams, err := f.scrape(ctx, u)
		if err != nil {
			return nil, err
		}
		sets = append(sets, f.ofTable(fams))
	}
	return readFlow(sets...), nil
}

// ofTable drops the series of other tables than f.table (those without a table
// label stay).
func (f *flowSource) ofTable(fams []*dto.MetricFamily) []*dto.MetricFamily {
	if f.table == "" {
		return fams
	}
	for _, fam := range fams {
		fam.Metric = slices.DeleteFunc(fam.Metric, func(m *dto.Metric) bool {
			for _, l := range m.GetLabel() {
				if l.GetName() == "table" {
					return l.GetValue() != f.table
				}
			}
			return false
		})
	}
	return fams
}

// scrape reads one relay's /metrics in the text format.
func (f *flowSource) scrape(ctx context.Context, url string) ([]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	return out, nil
}
