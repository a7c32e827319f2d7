package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// walker is a collector that costs what a walk of a big flow map costs: every Collect walks n
// entries (and counts its calls).
type walker struct {
	n     int
	calls atomic.Int64
	desc  *prometheus.Desc
	sink  atomic.Uint64
}

func newWalker(n int) *walker {
	return &walker{n: n, desc: prometheus.NewDesc("prg_test_entries", "entries walked", nil, nil)}
}

func (w *walker) Describe(ch chan<- *prometheus.Desc) { ch <- w.desc }
func (w *walker) Collect(ch chan<- prometheus.Metric) {
	w.calls.Add(1)
	var h uint64
	for i := 0; i < w.n; i++ { // a map walk: one lookup per entry
		h = h*31 + uint64(i)
	}
	w.sink.Store(h)
	ch <- prometheus.MustNewConstMetric(w.desc, prometheus.GaugeValue, float64(w.n))
}

// An attacker's flood of /metrics from many clients at once: the collector (the map walk)
// runs at most once per refresh period however many requests come, never more than
// MaxMetricsRequests are served at once, the excess is refused with 503 at once, and a scrape
// costs copying the snapshot, not walking the map (under 10 ms with a 50-million-entry walk).
func TestMetricsFloodIsBounded(t *testing.T) {
	w := newWalker(50_000_000)
	snap := NewSnapshot(Registry(w), 200*time.Millisecond)
	defer snap.Close()
	var inFlight, maxInFlight atomic.Int64
	counted := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		defer inFlight.Add(-1)
		snap.ServeHTTP(rw, r)
	})
	srv := httptest.NewServer(Limit(counted, MaxMetricsRequests))
	defer srv.Close()

	// The first scrape gathers.
	get := func(c *http.Client) (int, string) {
		resp, err := c.Get(srv.URL)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(http.DefaultClient); code != 200 || !strings.Contains(body, "prg_test_entries 5e+07") {
		t.Fatalf("first scrape: %d %.200s", code, body)
	}

	const clients, period = 64, 1500 * time.Millisecond
	before := snap.Gathers()
	f := testutil.FloodGET(clients, period, func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	}, srv.URL)
	gathers := snap.Gathers() - before
	t.Logf("%d clients for %s: %d served, %d refused (503), %d other; %d gatherings; at most %d at once",
		clients, period, f.OK, f.Busy, f.Other, gathers, maxInFlight.Load())
	if m := maxInFlight.Load(); m > MaxMetricsRequests {
		t.Errorf("%d requests served at once, the bound is %d", m, MaxMetricsRequests)
	}
	if f.Other != 0 || f.OK == 0 {
		t.Errorf("want only 200s and 503s, with some 200s")
	}
	// One gathering per 200 ms period, plus the one under way at the end.
	if limit := int64(period/(200*time.Millisecond)) + 2; gathers > limit {
		t.Errorf("%d gatherings during the flood, want at most %d (one per refresh period): the work grows with the requests", gathers, limit)
	}
	if f.OK+f.Busy < 10*gathers {
		t.Errorf("only %d requests for %d gatherings: the flood did not flood", f.OK+f.Busy, gathers)
	}

	// A scrape, the map walk notwithstanding: the snapshot's bytes. The median of 21 (the
	// machine is shared: one scrape may lose its CPU to the refresh's walk or a build).
	start := time.Now()
	if _, err := Registry(w).Gather(); err != nil {
		t.Fatal(err)
	}
	walk := time.Since(start)
	var took []time.Duration
	for i := 0; i < 21; i++ {
		start := time.Now()
		if code, _ := get(http.DefaultClient); code != 200 {
			t.Fatalf("scrape: %d", code)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("one gathering (the walk): %s; scrapes: median %s, worst %s", walk, took[10], took[20])
	if took[10] > 10*time.Millisecond {
		t.Errorf("a scrape took %s (median) with a big map, want under 10 ms", took[10])
	}
}

// Limit refuses, does not queue: with the n slots held, the next request is answered 503 at once.
func TestLimitRefusesBeyondN(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(2)
	h := Limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Done()
		<-release
	}), 2)
	for i := 0; i < 2; i++ {
		go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/metrics", nil))
	}
	started.Wait()
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil)); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("the request beyond the bound waited")
	}
	close(release)
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" {
		t.Errorf("beyond the bound: %d %v, want 503 with Retry-After", rec.Code, rec.Header())
	}
}

type failing struct{ calls atomic.Int64 }

func (f *failing) Gather() ([]*dto.MetricFamily, error) {
	f.calls.Add(1)
	return nil, errors.New("prg: no source")
}

// A gatherer that fails is run once per refresh period too, not once per request.
func TestSnapshotFailingGathererIsNotRunPerRequest(t *testing.T) {
	g := &failing{}
	snap := NewSnapshot(g, time.Hour)
	defer snap.Close()
	for i := 0; i < 50; i++ {
		rec := httptest.NewRecorder()
		snap.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d, want 503", i, rec.Code)
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("the failing gatherer ran %d times for 50 requests within one period, want 1", n)
	}
}
