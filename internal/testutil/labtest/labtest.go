// Package labtest is what every lab-based test needs: a lab that is torn down (attachments
// included: lab.Down is given datapath.ForgetNamespaces) and proven gone at the end, also on
// failure; the namespace of a node; the receive knobs of every device; and polling instead of sleeping.
package labtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Up builds spec's lab for the test (root required) and registers its teardown: lab.Down, then
// testutil.AssertClean on the lab's prefix (namespaces, links, pins, records).
func Up(t testing.TB, spec lab.Spec) *lab.Lab {
	t.Helper()
	testutil.RequireRoot(t)
	t.Cleanup(func() {
		if err := lab.Down(spec.Name, nil, datapath.ForgetNamespaces); err != nil && !errors.Is(err, lab.ErrNotUp) {
			t.Errorf("lab down %s: %v", spec.Name, err)
		}
		testutil.AssertClean(t, lab.NsPrefix(spec.Name))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l, err := lab.Up(ctx, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// NS is the namespace of a lab node by its short name ("h1", "h1-c1").
func NS(l *lab.Lab, short string) string { return lab.NsPrefix(l.Spec.Name) + short }

// RxKnobs reads the given per-queue files (default rps_cpus and rps_flow_cnt) of rx-0 of every
// device of every host, overlay and container namespace, keyed "netns:path". Devices without
// receive queues (bridges) have no entry.
func RxKnobs(t testing.TB, l *lab.Lab, files ...string) map[string]string {
	t.Helper()
	if len(files) == 0 {
		files = []string{"rps_cpus", "rps_flow_cnt"}
	}
	out := map[string]string{}
	for _, set := range [][]lab.Node{l.Hosts, l.Overlays, l.Containers} {
		for _, n := range set {
			for _, d := range n.Devices {
				for _, f := range files {
					p := "/sys/class/net/" + d.Name + "/queues/rx-0/" + f
					if v, err := netnsutil.ReadFileIn(n.Netns, p); err == nil {
						out[n.Netns+":"+p] = v
					}
				}
			}
		}
	}
	return out
}

// SameKnobs reports (as errors of the test, each prefixed with what) every knob RxKnobs reads
// with a value other than it had in before, an earlier RxKnobs of the same files.
func SameKnobs(t testing.TB, l *lab.Lab, before map[string]string, what string, files ...string) {
	t.Helper()
	after := RxKnobs(t, l, files...)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: %s is %q, was %q", what, k, after[k], v)
		}
	}
}

// Eventually polls cond every 10 ms until it holds or timeout passes; then it fails the test
// with cond's last explanation. It replaces fixed sleeps ("traffic has started").
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, timeout, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Settled reads every 20 ms until two reads in a row agree (what was in flight has been
// processed) or timeout passes, and returns the last read. It replaces "sleep a bit, then look".
func Settled[T comparable](timeout time.Duration, read func() T) T {
	deadline := time.Now().Add(timeout)
	last := read()
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		cur := read()
		if cur == last {
			return cur
		}
		last = cur
	}
	return last
}

// AddVXLAN creates an extra VXLAN device (up) on the underlay device dev of namespace ns, as an
// overlay created after attach would; the test's cleanup deletes it. It returns its ifindex.
func AddVXLAN(t testing.TB, ns, name string, vni, port int, dev string) int {
	t.Helper()
	idx := 0
	err := netnsutil.Do(ns, func() error {
		u, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vni, Port: port, VtepDevIndex: u.Attrs().Index}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("add VXLAN device %s in %s: %v", name, ns, err)
	}
	t.Cleanup(func() { DelLink(ns, name) })
	return idx
}

// DelLink deletes a device (a missing one is fine).
func DelLink(ns, name string) {
	_ = netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil
		}
		return netlink.LinkDel(l)
	})
}

// DetachAtEnd detaches everything attached to each target when the test ends, also on failure
// (registered after Up, it runs before the lab goes down). Errors are ignored: a test that
// detached by itself has nothing left to detach.
func DetachAtEnd(t testing.TB, targets ...string) {
	t.Cleanup(func() {
		for _, target := range targets {
			_, _ = datapath.Detach(context.Background(), target, "")
		}
	})
}

// PrivateState gives the test its own datapath state: records, agent logs and node agent
// status under t.TempDir(), pins under /sys/fs/bpf/prg-<name>-pins (removed when the test
// ends), so that nothing else attached on the machine is seen or touched. Call it before
// DetachAtEnd, whose detach must run first.
func PrivateState(t testing.TB, name string) {
	t.Helper()
	pins := "/sys/fs/bpf/prg-" + name + "-pins"
	testutil.Set(t, &datapath.StateDir, filepath.Join(t.TempDir(), "datapath"))
	testutil.Set(t, &datapath.AgentLogDir, filepath.Join(t.TempDir(), "agents"))
	testutil.Set(t, &datapath.NodeAgentDir, filepath.Join(t.TempDir(), "agent"))
	testutil.Set(t, &datapath.PinRoot, pins)
	t.Cleanup(func() { _ = os.RemoveAll(pins) })
}
