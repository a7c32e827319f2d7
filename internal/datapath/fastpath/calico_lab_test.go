package fastpath

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// calicoLab builds scripts/handbuilt-calico.sh's layout with pods pods per node.
func calicoLab(t *testing.T, name string, pods int) []string {
	t.Helper()
	testutil.RequireRoot(t)
	script, err := filepath.Abs("../../../scripts/handbuilt-calico.sh")
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"prg-" + name + "-n1", "prg-" + name + "-n2"}
	t.Cleanup(func() {
		for _, h := range hosts {
			if st, _ := datapath.LoadState(h, Name); st != nil {
				_, _ = datapath.Detach(context.Background(), h, "")
			}
		}
		if out, err := exec.Command(script, "down", name).CombinedOutput(); err != nil {
			t.Errorf("down: %v\n%s", err, out)
		}
		testutil.AssertClean(t, "prg-"+name+"-")
	})
	if out, err := exec.Command(script, "up", name, string(rune('0'+pods))).CombinedOutput(); err != nil {
		t.Fatalf("build the layout: %v\n%s", err, out)
	}
	return hosts
}

// TestCalicoLikeRefused: Calico's routed /32 pods (cali* veths, proxy ARP, no bridge) are a
// layout the fast path does not serve: attach refuses it naming why, and changes nothing; the
// overlay works as before.
func TestCalicoLikeRefused(t *testing.T) {
	hosts := calicoLab(t, "fca", 1)
	run(t, "prg-fca-n1-p1", "ping", "-c", "2", "-W", "1", "10.65.2.2")
	_, err := datapath.Attach(context.Background(), hosts[0], Name, datapath.Options{})
	if err == nil {
		t.Fatal("attach to a Calico-like layout succeeded")
	}
	for _, want := range []string{"vxlan.calico", "/32 routes", "cali", "Calico", "nothing was changed"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("refusal does not say %q: %v", want, err)
		}
	}
	if st, _ := datapath.LoadState(hosts[0], Name); st != nil {
		t.Fatal("a refused attach left a record")
	}
	if left, _ := filepath.Glob(datapath.ModePinDir(hosts[0], Name)); len(left) > 0 {
		t.Fatalf("a refused attach left pins: %v", left)
	}
	run(t, "prg-fca-n1-p1", "ping", "-c", "2", "-W", "1", "10.65.2.2")
}

// TestNoPodsWarns: an overlay with no pod at all attaches (pods may come later) but says so,
// naming what it looked for.
func TestNoPodsWarns(t *testing.T) {
	hosts := calicoLab(t, "fcz", 0)
	st, err := datapath.Attach(context.Background(), hosts[0], Name, datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range st.Topology.Notes {
		if strings.Contains(n, "vxlan.calico") && strings.Contains(n, "no pods found") && strings.Contains(n, "looked for veths on a bridge in "+hosts[0]) {
			found = true
		}
	}
	if !found {
		t.Fatalf("attach with no pods gave no warning naming what it looked for: %q", st.Topology.Notes)
	}
}
