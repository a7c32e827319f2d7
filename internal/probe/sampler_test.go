package probe

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestSamplerSeriesAndTotals(t *testing.T) {
	ns := testNS(t)
	s := NewSampler(SamplerConfig{
		Interval: 40 * time.Millisecond,
		Namespaces: map[string][]string{
			ns: {"Udp.NoPorts", "Udp.InDatagrams", "Bogus.Counter"},
			"": nil, // the caller's namespace with DefaultCounters
		},
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Error("second Start: no error")
	}
	const n = 25
	for i := 0; i < 4; i++ {
		sendToClosedPort(t, ns, n)
		time.Sleep(60 * time.Millisecond)
	}
	waitCounter(t, ns, "Udp.NoPorts", 4*n)
	r, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stop(); err == nil {
		t.Error("second Stop: no error")
	}
	if len(r.Errors) > 0 {
		t.Errorf("errors: %v", r.Errors)
	}
	if got := r.MissingCounters[ns]; len(got) != 1 || got[0] != "Bogus.Counter" {
		t.Errorf("missing counters %v, want [Bogus.Counter]", r.MissingCounters)
	}
	if got := r.Totals.Nstat[ns]["Udp.NoPorts"]; got != 4*n {
		t.Errorf("totals Udp.NoPorts in %s = %d, want %d", ns, got, 4*n)
	}
	if _, ok := r.Totals.Nstat[ns]["Bogus.Counter"]; ok {
		t.Error("a missing counter appears in the totals")
	}
	if len(r.Totals.Nstat[""]) != len(DefaultCounters) {
		t.Errorf("root namespace: %d counters, want the %d defaults", len(r.Totals.Nstat[""]), len(DefaultCounters))
	}
	if r.Totals.CPU == nil || r.Totals.Softirqs == nil || r.Totals.Softnet == nil || r.Totals.Interrupts == nil {
		t.Fatalf("totals incomplete: %+v", r.Totals)
	}
	checkShareInvariants(t, *r.Totals.CPU)

	// ~240 ms at 40 ms: several samples, contiguous, and the series adds up to the totals.
	if len(r.Series) < 3 {
		t.Fatalf("%d samples, want at least 3", len(r.Series))
	}
	var noPorts int64
	netRX := make([]uint64, len(r.Totals.Softirqs.CPUs))
	var processed uint64
	end := 0.0
	emptyCPU := 0
	for i, iv := range r.Series {
		if math.Abs(iv.StartS-end) > 1e-6 {
			t.Errorf("sample %d starts at %.6f s, previous ended at %.6f s", i, iv.StartS, end)
		}
		end = iv.StartS + iv.DurationS
		if iv.Softirqs == nil || iv.Softnet == nil || iv.Nstat[ns] == nil {
			t.Fatalf("sample %d incomplete", i)
		}
		// A sample may lack CPU shares when a CPU accounted no tick in it (short interval, loaded
		// VM); the report counts those.
		if iv.CPU != nil {
			checkShareInvariants(t, *iv.CPU)
		} else {
			emptyCPU++
		}
		if len(iv.Softirqs.Counts) != 2 {
			t.Errorf("sample %d keeps softirq rows %v, want NET_RX and NET_TX only", i, iv.Softirqs.Counts)
		}
		noPorts += iv.Nstat[ns]["Udp.NoPorts"]
		for c, v := range iv.Softirqs.Counts["NET_RX"] {
			netRX[c] += v
		}
		processed += iv.Softnet.Total.Processed
	}
	if emptyCPU != r.EmptyCPUSamples {
		t.Errorf("%d samples without CPU shares, report says %d", emptyCPU, r.EmptyCPUSamples)
	}
	if emptyCPU == len(r.Series) {
		t.Error("no sample has CPU shares")
	}
	if math.Abs(end-r.DurationS) > 1e-6 {
		t.Errorf("series ends at %.6f s, run lasted %.6f s", end, r.DurationS)
	}
	if noPorts != 4*n {
		t.Errorf("series Udp.NoPorts sums to %d, totals say %d", noPorts, 4*n)
	}
	for c, v := range r.Totals.Softirqs.Counts["NET_RX"] {
		if netRX[c] != v {
			t.Errorf("cpu%d: series NET_RX sums to %d, totals %d", r.Totals.Softirqs.CPUs[c], netRX[c], v)
		}
	}
	if processed != r.Totals.Softnet.Total.Processed {
		t.Errorf("series softnet processed sums to %d, totals %d", processed, r.Totals.Softnet.Total.Processed)
	}
	// Loopback delivery goes through the backlog: the 100 datagrams show up as processed packets.
	if r.Totals.Softnet.Total.Processed < 4*n {
		t.Errorf("softnet processed %d < %d datagrams sent", r.Totals.Softnet.Total.Processed, 4*n)
	}

	// The report goes verbatim into result files: snake_case keys and a lossless round trip.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"duration_s"`, `"interval_ms"`, `"totals"`, `"series"`, `"per_cpu"`,
		`"busy_cpus"`, `"softirq"`, `"time_squeeze"`, `"received_rps"`, `"missing_counters"`, `"Udp.NoPorts"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Totals.Nstat[ns]["Udp.NoPorts"] != 4*n || len(back.Series) != len(r.Series) {
		t.Error("JSON round trip lost data")
	}
}

func TestSamplerTotalsOnly(t *testing.T) {
	s := NewSampler(SamplerConfig{})
	if _, err := s.Stop(); err == nil {
		t.Error("Stop before Start: no error")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	r, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if r.Series != nil || r.IntervalMS != 0 || r.Totals.Nstat != nil {
		t.Errorf("totals-only report has series %v interval %v nstat %v", r.Series, r.IntervalMS, r.Totals.Nstat)
	}
	if r.Totals.CPU == nil {
		t.Errorf("no CPU totals; errors %v", r.Errors)
	}
}

func TestSamplerBadNamespace(t *testing.T) {
	s := NewSampler(SamplerConfig{Namespaces: map[string][]string{"prg-tprobe-does-not-exist": nil}})
	if err := s.Start(); err == nil {
		t.Error("Start with a missing namespace: no error")
	}
}

func TestDiffReportsPartialFailure(t *testing.T) {
	a := Snapshot{Time: time.Unix(100, 0), CPU: mustParse(t, ParseCPUStat, statA), Softirqs: mustParse(t, ParseSoftirqs, softirqsA),
		Softnet: mustParse(t, ParseSoftnet, softnet15A), Interrupts: mustParse(t, ParseInterrupts, interruptsA), Nstat: map[string]Counters{"x": fixtureCounters(t)}}
	b := Snapshot{Time: time.Unix(101, 0), CPU: mustParse(t, ParseCPUStat, statB), Softirqs: mustParse(t, ParseSoftirqs, softirqsB),
		Softnet: mustParse(t, ParseSoftnet, softnet13A), Interrupts: mustParse(t, ParseInterrupts, interruptsB), Nstat: map[string]Counters{"x": fixtureCounters(t)}}
	iv, errs := Diff(a, b, map[string][]string{"x": DefaultCounters}, time.Unix(99, 0))
	if len(errs) != 1 || iv.Softnet != nil {
		t.Errorf("softnet layout change: errs %v, softnet %v", errs, iv.Softnet)
	}
	if iv.CPU == nil || iv.Softirqs == nil || iv.Nstat["x"] == nil || iv.Interrupts == nil {
		t.Error("a failing part took the others down")
	}
	if iv.StartS != 1 || iv.DurationS != 1 {
		t.Errorf("start %v duration %v", iv.StartS, iv.DurationS)
	}
}
