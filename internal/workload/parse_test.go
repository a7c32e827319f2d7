package workload

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The testdata files are real outputs captured on loopback (iperf3 3.12, sockperf 3.7,
// wrk 4.1) on the 2-vCPU lab machine.

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestParseIperf3TCPParallel(t *testing.T) {
	r, err := ParseIperf3([]byte(readTestdata(t, "iperf3_tcp_p2.json")))
	if err != nil {
		t.Fatal(err)
	}
	if r.Protocol != "TCP" || r.Streams != 2 || r.Length != 131072 {
		t.Errorf("header: %+v", r)
	}
	if r.SentBytes != 5578424320 || r.ReceivedBytes != 5578424320 || r.Retransmits != 2 {
		t.Errorf("sums: sent %d recv %d retr %d", r.SentBytes, r.ReceivedBytes, r.Retransmits)
	}
	if !near(r.ReceivedBps, 44622441468.99694) || !near(r.SentBps, 44623601553.86793) {
		t.Errorf("bps: sent %g recv %g", r.SentBps, r.ReceivedBps)
	}
	if len(r.PerStream) != 2 || r.PerStream[0].SentBytes != 2789212160 || r.PerStream[0].Retransmits != 2 {
		t.Errorf("per stream: %+v", r.PerStream)
	}
	if !near(r.CPU.LocalTotal, 94.97021635066454) || !near(r.CPU.RemoteSystem, 84.16253217107513) {
		t.Errorf("cpu: %+v", r.CPU)
	}
	if r.UDP != nil {
		t.Error("TCP result has UDP section")
	}
}

func TestParseIperf3TCPSingle(t *testing.T) {
	r, err := ParseIperf3([]byte(readTestdata(t, "iperf3_tcp_p1.json")))
	if err != nil {
		t.Fatal(err)
	}
	if r.Streams != 1 || r.Length != 16384 || r.ReceivedBytes != 2740633600 || r.SenderCongestion != "bbr" {
		t.Errorf("%+v", r)
	}
}

func TestParseIperf3UDPReceiverTruth(t *testing.T) {
	r, err := ParseIperf3([]byte(readTestdata(t, "iperf3_udp_p2.json")))
	if err != nil {
		t.Fatal(err)
	}
	if r.Protocol != "UDP" || r.UDP == nil || r.Length != 64 {
		t.Fatalf("%+v", r)
	}
	u := r.UDP
	// Server side: 254576 packets, 4174 lost.
	if u.PacketsLost != 4174 || u.PacketsDelivered != 254576-4174 {
		t.Errorf("lost %d delivered %d", u.PacketsLost, u.PacketsDelivered)
	}
	if r.ReceivedBytes != 16025728 || r.ReceivedBytes != uint64(u.PacketsDelivered)*64 {
		t.Errorf("received bytes %d", r.ReceivedBytes)
	}
	if !near(u.DeliveredPPS, float64(254576-4174)/1.000052) {
		t.Errorf("pps %g", u.DeliveredPPS)
	}
	if u.PacketsSent < u.PacketsDelivered {
		t.Errorf("sent %d < delivered %d", u.PacketsSent, u.PacketsDelivered)
	}
	if len(r.PerStream) != 2 {
		t.Fatalf("per stream: %+v", r.PerStream)
	}
	var sum int64
	for _, s := range r.PerStream {
		sum += s.PacketsDelivered
		if s.ReceivedBytes == 0 || s.PacketsSent == 0 {
			t.Errorf("stream %+v", s)
		}
	}
	if sum != u.PacketsDelivered {
		t.Errorf("per-stream delivered %d != total %d", sum, u.PacketsDelivered)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Error(err)
	}
}

func TestParseIperf3Error(t *testing.T) {
	_, err := ParseIperf3([]byte(readTestdata(t, "iperf3_refused.json")))
	if err == nil || !strings.Contains(err.Error(), "Connection refused") {
		t.Fatalf("want connection refused error, got %v", err)
	}
	if _, err := ParseIperf3([]byte("iperf3: error - bad")); err == nil {
		t.Error("non-JSON accepted")
	}
}

func TestParseSockperf(t *testing.T) {
	cases := []struct {
		file                     string
		obs, recv                int64
		avg, p50, p99, p999, max float64
	}{
		{"sockperf_pingpong_udp.txt", 28966, 28966, 9.496, 9.182, 15.002, 36.923, 1011.677},
		{"sockperf_pingpong_tcp.txt", 25693, 25693, 10.694, 10.389, 16.560, 27.160, 522.199},
		// under-load: only every 100th message is answered and timed; the TCP capture has a
		// stray line from another process inside the percentile block.
		{"sockperf_underload_tcp.txt", 53, 53, 14.966, 14.767, 21.104, 21.184, 21.184},
		{"sockperf_underload_udp.txt", 308, 308, 23.897, 10.063, 464.995, 1977.824, 1977.824},
	}
	for _, c := range cases {
		r, err := ParseSockperf(readTestdata(t, c.file))
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		if r.Observations != c.obs || r.ReceivedMessages != c.recv || r.AvgUs != c.avg || r.P50Us != c.p50 ||
			r.P99Us != c.p99 || r.P999Us != c.p999 || r.MaxUs != c.max {
			t.Errorf("%s: %+v", c.file, r)
		}
		if !(r.MinUs <= r.P50Us && r.P50Us <= r.P90Us && r.P90Us <= r.P99Us && r.P99Us <= r.MaxUs) {
			t.Errorf("%s: percentiles out of order: %+v", c.file, r)
		}
	}
}

func TestParseSockperfFailures(t *testing.T) {
	// sockperf 3.7 exits 0 in both cases; the output is all we have.
	for file, want := range map[string]string{
		"sockperf_noreply.txt":     "No messages were received",
		"sockperf_refused_tcp.txt": "Connection refused",
	} {
		_, err := ParseSockperf(readTestdata(t, file))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want %q, got %v", file, want, err)
		}
	}
	if _, err := ParseSockperf(""); err == nil {
		t.Error("empty output accepted")
	}
}

func TestParseWrk(t *testing.T) {
	r, err := ParseWrk(readTestdata(t, "wrk_latency.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := WrkResult{Threads: 1, Connections: 8, Requests: 40031, DurationS: 1.1, ReadBytes: 48.79 * (1 << 20),
		RequestsPerSec: 36386.86, TransferBytesPerSec: 44.35 * (1 << 20), LatencyAvgUs: 219.73,
		LatencyStdevUs: 71.29, LatencyMaxUs: 2280, P50Us: 211, P75Us: 220, P90Us: 238, P99Us: 417}
	if !nearWrk(r, want) {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
	if err := r.check(); err != nil {
		t.Error(err)
	}
}

func nearWrk(a, b WrkResult) bool {
	fa := []float64{a.DurationS, a.ReadBytes, a.RequestsPerSec, a.TransferBytesPerSec, a.LatencyAvgUs, a.LatencyStdevUs, a.LatencyMaxUs, a.P50Us, a.P75Us, a.P90Us, a.P99Us}
	fb := []float64{b.DurationS, b.ReadBytes, b.RequestsPerSec, b.TransferBytesPerSec, b.LatencyAvgUs, b.LatencyStdevUs, b.LatencyMaxUs, b.P50Us, b.P75Us, b.P90Us, b.P99Us}
	for i := range fa {
		if !near(fa[i], fb[i]) {
			return false
		}
	}
	return a.Threads == b.Threads && a.Connections == b.Connections && a.Requests == b.Requests
}

func TestParseWrkErrors(t *testing.T) {
	r, err := ParseWrk(readTestdata(t, "wrk_404.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Non2xx3xx != 70359 || r.check() == nil {
		t.Errorf("all-404 run not flagged: %+v", r)
	}
	withSock := "Running 1s test @ http://x/\n  1 threads and 1 connections\n  Latency Distribution\n     50%  1.00ms\n" +
		"  10 requests in 1.00s, 1.00KB read\n  Socket errors: connect 0, read 3, write 0, timeout 2\nRequests/sec:     10.00\nTransfer/sec:      1.00KB\n"
	r, err = ParseWrk(withSock)
	if err != nil || r.ErrorsRead != 3 || r.ErrorsTimeout != 2 || r.P50Us != 1000 {
		t.Errorf("socket errors: %+v %v", r, err)
	}
	if _, err := ParseWrk("unable to connect to 198.18.251.1:8080 Connection refused"); err == nil {
		t.Error("failure output accepted")
	}
}

func TestWrkUnits(t *testing.T) {
	for s, us := range map[string]float64{"211.00us": 211, "1.50ms": 1500, "2.00s": 2e6, "1.00m": 60e6} {
		if v, err := wrkTimeUs(s); err != nil || v != us {
			t.Errorf("%s: %g %v", s, v, err)
		}
	}
	for s, b := range map[string]float64{"512.00B": 512, "1.00KB": 1024, "2.00MB": 2 << 20, "1.00GB": 1 << 30} {
		if v, err := wrkBytes(s); err != nil || v != b {
			t.Errorf("%s: %g %v", s, v, err)
		}
	}
}

func TestHistogram(t *testing.T) {
	// Buckets are contiguous and monotonic, and a value lies inside its own bucket.
	for v := uint64(0); v < 1<<22; v += 1 + v/97 {
		i := bucketOf(v)
		low, w := bucketLow(i)
		if v < low || v >= low+w {
			t.Fatalf("value %d in bucket %d [%d,%d)", v, i, low, low+w)
		}
	}
	var h latencyHist
	for i := 1; i <= 10000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for q, want := range map[float64]float64{0.5: 5000, 0.99: 9900, 0.999: 9990} {
		got := h.quantileUs(q)
		if math.Abs(got-want)/want > 0.01 {
			t.Errorf("q%g = %g, want ~%g", q, got, want)
		}
	}
	if h.quantileUs(1) != 10000 || !near(h.meanUs(), 5000.5) {
		t.Errorf("max %g mean %g", h.quantileUs(1), h.meanUs())
	}
}

func TestTableHasListener(t *testing.T) {
	tcp := "  sl  local_address rem_address   st\n" +
		"   0: 01FBFEC6:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n" +
		"   1: 01FBFEC6:1452 02FBFEC6:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n"
	if !tableHasListener([]byte(tcp), "tcp", 0x1451) || tableHasListener([]byte(tcp), "tcp", 0x1452) {
		t.Error("tcp listen detection")
	}
	udp := "  sl  local_address rem_address   st\n" +
		"  1: 01FBFEC6:2B67 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 3\n"
	if !tableHasListener([]byte(udp), "udp", 11111) {
		t.Error("udp bound detection")
	}
}

func TestParseCPUList(t *testing.T) {
	got, err := parseCPUList("0,2-3")
	if err != nil || len(got) != 3 || got[0] != 0 || got[2] != 3 {
		t.Errorf("%v %v", got, err)
	}
	for _, bad := range []string{"a", "3-1", "-1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRequire(t *testing.T) {
	err := Require("sh", "peregrine-no-such-tool", "wrk-missing-xyz")
	if err == nil || !strings.Contains(err.Error(), "peregrine-no-such-tool not found: run scripts/setup.sh or apt-get install") {
		t.Fatalf("%v", err)
	}
	if Require("sh") != nil {
		t.Error("sh reported missing")
	}
}

func TestStripANSI(t *testing.T) {
	if got := stripANSI("a\x1b[2;35mb\x1b[0mc"); got != "abc" {
		t.Errorf("%q", got)
	}
}
