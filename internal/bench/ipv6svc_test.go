package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// --ipv6 --via-service: crr connects to default/one's IPv6 ClusterIP on the dual-stack lab.
// Its server listens on the receiver's IPv6 address only, so every completed connection went
// through the IPv6 translation (an IPv4 ClusterIP would reach no listener); none fails, and the
// lab is gone after.
func TestBenchIPv6ViaService(t *testing.T) {
	testutil.RequireRoot(t)
	o := Options{
		Configs:  []Config{{Style: lab.StyleFlannel, Mode: ModeVanilla}},
		Scenario: Scenario{Name: "crr", Duration: time.Second, Reps: 1, IPv6: true, ViaService: true, ProxyMode: lab.ProxyNFTables},
		OutDir:   t.TempDir(),
	}
	_, path, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
	back, err := results.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Complete || len(back.Points) != 1 {
		t.Fatalf("run incomplete or wrong shape: complete=%v points=%d", back.Complete, len(back.Points))
	}
	m := back.Points[0].Reps[len(back.Points[0].Reps)-1].Metrics
	t.Logf("crr via the IPv6 ClusterIP: %.0f connections/s, p50 %.0f µs, %v failures", m["connections_per_s"], m[results.MetricLatencyP50], m["failures_count"])
	if m["connections_per_s"] < 50 || m["failures_count"] != 0 {
		t.Fatalf("crr via the IPv6 ClusterIP: %v connections/s, %v failures", m["connections_per_s"], m["failures_count"])
	}
}
