package dashboard

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestQuantile(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	for _, tc := range []struct {
		q    float64
		bs   []bucket
		want float64
		ok   bool
	}{
		{0.5, nil, 0, false},
		{0.5, []bucket{{0.001, 0}, {0.002, 0}, {inf, 0}}, 0, false},
		{0.5, []bucket{{0.001, 0}, {0.002, 10}, {inf, 10}}, 0.0015, true},      // inside the bucket that holds it
		{0.99, []bucket{{0.001, 50}, {0.002, 100}, {inf, 100}}, 0.00198, true}, // interpolated
		{0.99, []bucket{{0.001, 0}, {0.002, 1}, {inf, 100}}, 0.002, true},      // past the last bound: the bound
	} {
		got, ok := quantile(tc.q, tc.bs)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile(%v, %v) = %v, %v; want %v, %v", tc.q, tc.bs, got, ok, tc.want, tc.ok)
		}
	}
}

// TestFlowFromRegistry reads the relay's metrics as relayprom registers them, and
// derives the rate and latency between two samples; a counter that went down (a
// restarted relay) gives no point rather than a negative rate.
func TestFlowFromRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPublished}, []string{"topic"})
	lat := prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricLatency, Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	reg.MustRegister(pub, lat)
	src := flowSource{gatherer: reg}
	t0 := time.Unix(1000, 0)
	read := func(at time.Time) sample {
		f, err := src.read(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return sample{at: at, flow: f}
	}
	s0 := read(t0)
	pub.WithLabelValues("a").Add(300)
	pub.WithLabelValues("b").Add(100)
	for i := 0; i < 400; i++ {
		lat.Observe(0.003)
	}
	s1 := read(t0.Add(2 * time.Second))
	restarted := sample{at: t0.Add(4 * time.Second), flow: &reading{published: 5}}
	rate, p50, p99 := flowSeries([]sample{s0, s1, restarted})
	if len(rate) != 1 || rate[0].v != 200 {
		t.Fatalf("rate = %v, want one point of 200/s", rate)
	}
	if len(p50) != 1 || p50[0].v < 0.002 || p50[0].v > 0.004 || len(p99) != 1 || p99[0].v < 0.002 || p99[0].v > 0.004 {
		t.Fatalf("p50 = %v, p99 = %v; want within the 2–4 ms bucket", p50, p99)
	}
}

// TestScrape reads relays' /metrics over HTTP in the text format and sums them; an
// endpoint that does not answer is an error naming it.
func TestScrape(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPublished}, []string{"topic"})
	reg.MustRegister(pub)
	pub.WithLabelValues("a").Add(7)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	src := flowSource{urls: []string{srv.URL + "/metrics", srv.URL + "/metrics"}, client: srv.Client()}
	f, err := src.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f.published != 14 {
		t.Fatalf("published = %v, want 14 (7 from each relay named)", f.published)
	}
	src.urls = []string{srv.URL + "/nope"}
	if _, err := src.read(t.Context()); err == nil || !strings.Contains(err.Error(), "/nope") {
		t.Fatalf("a missing endpoint: %v", err)
	}
}

// TestFlowOfOneTable: of a registry many tables' relays report to, a table's
// dashboard counts its own table's series, from the registry and from /metrics alike
// (TestFlowFromRegistry: series with no table label all count).
func TestFlowOfOneTable(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for i, table := range []string{"a.outbox", "b.outbox"} {
		pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPublished}, []string{"topic"})
		prometheus.WrapRegistererWith(prometheus.Labels{"table": table}, reg).MustRegister(pub)
		pub.WithLabelValues("x").Add(float64(10 * (i + 1)))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, src := range []flowSource{
		{gatherer: reg, table: "b.outbox"},
		{urls: []string{srv.URL + "/metrics"}, client: srv.Client(), table: "b.outbox"},
	} {
		f, err := src.read(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if f.published != 20 {
			t.Fatalf("published = %v, want 20 (b.outbox's alone)", f.published)
		}
	}
}
