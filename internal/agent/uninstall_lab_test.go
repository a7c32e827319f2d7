package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// Uninstall refuses while a node agent runs (here: one whose status file beats, as an agent in
// another PID namespace's does), and otherwise detaches every attachment (knobs back to their
// old values) and removes the pins and the state. The state and pin roots are the test's own,
// so that nothing else on the machine is touched.
func TestUninstallRemovesEverything(t *testing.T) {
	testutil.RequireBPF(t)
	l := labtest.Up(t, lab.Spec{Name: "tagx", Style: lab.StyleFlannel, Containers: 1})
	h1 := l.Hosts[0].Netns
	labtest.PrivateState(t, "tagx")
	labtest.DetachAtEnd(t, h1)
	if _, err := datapath.Attach(context.Background(), h1, fastpath.Name, datapath.Options{Extra: map[string]string{fastpath.OptAgent: "false"}}); err != nil {
		t.Fatal(err)
	}
	rps, err := datapath.Attach(context.Background(), h1, "rps", datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeStatus(&Status{PID: 1 << 30, Config: "/etc/peregrine/config.yaml", Target: h1,
		Updated: time.Now(), Interval: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if left, err := Leftovers(); err != nil || len(left) < 2 {
		t.Fatalf("before uninstall, --check finds %q, %v; want the two attachments and the directories", left, err)
	}
	if _, err := Uninstall(context.Background(), false); err == nil || !strings.Contains(err.Error(), "node agent") {
		t.Fatalf("uninstall beside a running node agent: %v", err)
	}
	if sts, _ := datapath.LoadStates(h1); len(sts) != 2 {
		t.Fatalf("a refused uninstall changed the attachments: %d left", len(sts))
	}
	done, err := Uninstall(context.Background(), true)
	if err != nil || len(done) != 2 {
		t.Fatalf("uninstall: %d detached, %v", len(done), err)
	}
	for _, k := range rps.Knobs {
		if live := datapath.CurrentValue(k); !datapath.SameValue(live, k.Old) {
			t.Errorf("%s: %q after uninstall, want %q", k, live, k.Old)
		}
	}
	for _, dir := range []string{datapath.PinRoot, datapath.StateDir, datapath.AgentLogDir, datapath.NodeAgentDir} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s is still there after uninstall (%v)", dir, err)
		}
	}
	if left, err := Leftovers(); err != nil || len(left) != 0 {
		t.Errorf("after uninstall, --check finds %q, %v", left, err)
	}
}
