package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

func TestServeExportsKernelCounters(t *testing.T) {
	// No attachment of this machine's (whose records are root's alone) takes part: an empty
	// state directory of the test's own.
	old := datapath.StateDir
	datapath.StateDir = t.TempDir()
	t.Cleanup(func() { datapath.StateDir = old })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, New(nil)) }()
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`peregrine_softnet_total{counter="processed",cpu="0"}`,
		`peregrine_softirqs_total{cpu="0",type="NET_RX"}`,
		"go_goroutines",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(text, "peregrine_scrape_errors") {
		t.Errorf("a source failed:\n%s", grep(text, "scrape_errors"))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("server did not stop")
	}
}

func grep(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestScrapeErrorsOneSamplePerSource: a mode failing for two of its attachments yields one
// scrape_errors sample counting both; two samples with the same labels made the registry
// refuse the whole scrape (seen: two fastpath records whose maps could not be read).
func TestScrapeErrorsOneSamplePerSource(t *testing.T) {
	c := New(nil)
	ch := make(chan prometheus.Metric, 4)
	c.failures(ch, map[string]int{"fastpath": 2, "stage": 1})
	close(ch)
	got := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		got[pb.GetLabel()[0].GetValue()] += pb.GetGauge().GetValue()
	}
	if len(got) != 2 || got["fastpath"] != 2 || got["stage"] != 1 {
		t.Fatalf("scrape_errors samples %v, want fastpath 2 and stage 1, one each", got)
	}
}
