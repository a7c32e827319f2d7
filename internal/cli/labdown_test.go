package cli

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// `lab down --all` removes the labs and their attachments, and never an attachment to another
// namespace: an rps attachment on a namespace that is no lab's (a real node's stands for it)
// keeps its record and its knobs, until it is detached.
func TestLabDownAllKeepsOtherAttachments(t *testing.T) {
	testutil.RequireRoot(t)
	const ns = "prgt-keep" // not prg-: no lab's
	// `lab down --all` removes every lab on the machine, not only this test's: refuse to run
	// beside another lab (a developer's, another test run's) rather than tear it down.
	if others := otherLabNamespaces(t); len(others) > 0 {
		t.Fatalf("other labs are up (%s): this test runs `lab down --all`, which would remove them; run it when no other lab is up", strings.Join(others, ", "))
	}
	testutil.TempNetns(t, ns)
	if err := netnsutil.Do(ns, func() error {
		// An underlay (a veth pair: the kernel may lack dummy devices) for a VXLAN device.
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "u0"}, PeerName: "u1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		for _, n := range []string{"u0", "u1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	labtest.AddVXLAN(t, ns, "vx0", 42, 4789, "u0")
	l := labtest.Up(t, lab.Spec{Name: "tdown", Style: lab.StyleFlannel, Containers: 1})
	h1 := l.Hosts[0].Netns
	keep, err := datapath.Attach(context.Background(), ns, "rps", datapath.Options{Underlay: "u0"})
	if err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, ns)
	if _, err := datapath.Attach(context.Background(), h1, "rps", datapath.Options{}); err != nil {
		t.Fatal(err)
	}

	// A node agent's status file for the lab host (its agent was killed with the lab).
	if err := safefile.WriteFile(datapath.NodeAgentStatus(h1), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	c := newLabDownCmd()
	c.SetArgs([]string{"--all"})
	if err := c.Execute(); err != nil {
		t.Fatalf("lab down --all: %v", err)
	}

	if st, _ := datapath.LoadState(h1, "rps"); st != nil {
		t.Errorf("the lab's attachment survived lab down --all")
	}
	if _, err := os.Stat(datapath.NodeAgentStatus(h1)); !os.IsNotExist(err) {
		t.Errorf("the lab host's node agent status file survived lab down --all (%v)", err)
	}
	if netnsutil.Exists(h1) {
		t.Errorf("the lab's namespace survived lab down --all")
	}
	st, err := datapath.LoadState(ns, "rps")
	if err != nil || st == nil {
		t.Fatalf("lab down --all removed the attachment to %s (a namespace of no lab): %v", ns, err)
	}
	for _, k := range keep.Knobs {
		if live := datapath.CurrentValue(k); !datapath.SameValue(live, k.New) {
			t.Errorf("%s: %q after lab down --all, want the attachment's %q", k, live, k.New)
		}
	}
	if _, err := datapath.Detach(context.Background(), ns, ""); err != nil {
		t.Fatal(err)
	}
	for _, k := range keep.Knobs {
		if live := datapath.CurrentValue(k); !datapath.SameValue(live, k.Old) {
			t.Errorf("%s: %q after detach, want %q", k, live, k.Old)
		}
	}
}

// otherLabNamespaces lists the named network namespaces that belong to a lab (lab.Prefix).
func otherLabNamespaces(t *testing.T) []string {
	t.Helper()
	es, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), lab.Prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}
