package modes

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The tests attach modes whose agents are started as this test binary.
func TestMain(m *testing.M) { agenttest.Main(m) }

// withFalcon builds a one-container docker lab called name and attaches falcon to its
// receiving host (keeping the underlay, on cpus when given). It returns the lab, that host, the
// options falcon got (for the mode stacked next) and the receive knobs before the attach.
func withFalcon(t *testing.T, name string, cpus []int) (*lab.Lab, string, datapath.Options, map[string]string) {
	t.Helper()
	l := labtest.Up(t, lab.Spec{Name: name, Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	before := labtest.RxKnobs(t, l)
	host := l.Hosts[1].Netns
	keep := datapath.Options{KeepUnderlay: true, CPUs: cpus}
	if _, err := datapath.Attach(context.Background(), host, "falcon", keep); err != nil {
		t.Fatal(err)
	}
	return l, host, keep, before
}

// falcon and prism touch different hooks and knobs, so they stack; rps shares falcon's knobs,
// so it is refused; detach --mode takes one off and leaves the other working.
func TestFalconAndPrismStack(t *testing.T) {
	l, host, keep, before := withFalcon(t, "tstack", nil)
	ctx := context.Background()
	pr := keep
	pr.Extra = map[string]string{"rules": "dport=7000", "agent": "off"}
	if _, err := datapath.Attach(ctx, host, "prism", pr); err != nil {
		t.Fatalf("prism should stack on falcon: %v", err)
	}
	if _, err := datapath.Attach(ctx, host, "rps", keep); err == nil || !strings.Contains(err.Error(), "cannot be stacked") {
		t.Fatalf("rps shares falcon's knobs and must be refused: %v", err)
	}
	sts, _ := datapath.LoadStates(host)
	if len(sts) != 2 || sts[0].Mode != "falcon" || sts[1].Mode != "prism" {
		t.Fatalf("want falcon then prism on record, got %d records", len(sts))
	}
	// The stacked overlay still carries traffic end to end.
	if err := lab.Verify(ctx, l); err != nil {
		t.Fatalf("connectivity with falcon+prism: %v", err)
	}
	if _, err := datapath.Detach(ctx, host, "prism"); err != nil {
		t.Fatal(err)
	}
	if st, _ := datapath.LoadState(host, "falcon"); st == nil {
		t.Fatal("detach --mode prism removed falcon too")
	}
	if _, err := datapath.Detach(ctx, host, "prism"); err == nil {
		t.Fatal("detaching a mode that is not attached should fail")
	}
	if _, err := datapath.Detach(ctx, host, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := datapath.Detach(ctx, host, ""); err == nil || errors.Is(err, nil) {
		t.Fatal("nothing left to detach should be an error")
	}
	labtest.SameKnobs(t, l, before, "after detaching both")
}

// mflow attached after falcon splits only the NIC stage and leaves the later stages to falcon;
// device scaling, which would steer the VXLAN stage too, is refused.
func TestMflowStacksOnFalcon(t *testing.T) {
	l, host, keep, before := withFalcon(t, "tstkm", []int{0, 1})
	ctx := context.Background()
	dev := keep
	dev.Extra = map[string]string{"split_at": "device"}
	if _, err := datapath.Attach(ctx, host, "mflow", dev); err == nil || !strings.Contains(err.Error(), "falcon") {
		t.Fatalf("device scaling on falcon should be refused: %v", err)
	}
	st, err := datapath.Attach(ctx, host, "mflow", keep)
	if err != nil {
		t.Fatalf("mflow (full path) should stack on falcon: %v", err)
	}
	for _, k := range st.Knobs {
		if !strings.Contains(k.Path, "/eth0/") || k.Netns != host {
			t.Errorf("mflow on falcon should only touch the underlay, changed %s", k)
		}
	}
	if err := lab.Verify(ctx, l); err != nil {
		t.Fatalf("connectivity with falcon+mflow: %v", err)
	}
	if _, err := datapath.Detach(ctx, host, ""); err != nil {
		t.Fatal(err)
	}
	labtest.SameKnobs(t, l, before, "after detach")
}
