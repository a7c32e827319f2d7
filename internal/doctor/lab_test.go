package doctor

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

func find(t *testing.T, checks []Check, name string) Check {
	t.Helper()
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %s check in %+v", name, checks)
	return Check{}
}

func setMTU(t *testing.T, ns, dev string, mtu int) {
	t.Helper()
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, mtu)
	})
	if err != nil {
		t.Fatalf("set %s/%s MTU %d: %v", ns, dev, mtu, err)
	}
}

// TestDoctorOnFlannelLab: on a flannel lab the overlay is found and its MTUs pass; an underlay
// lowered below the VXLAN device's MTU + 50, and then a pod raised above the VXLAN device's
// MTU, each fail the MTU check with the fix, and Required refuses.
func TestDoctorOnFlannelLab(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tdoc", Style: lab.StyleFlannel, Containers: 2})
	h1 := labtest.NS(l, "h1")
	checks, err := Run(context.Background(), Target{Netns: h1})
	if err != nil {
		t.Fatal(err)
	}
	// The test machine must have what peregrine needs (a missing feature is a broken machine).
	for _, n := range []string{"privileges", "bpffs", "btf", "tcx", "redirect_peer"} {
		if c := find(t, checks, n); c.Status != OK {
			t.Errorf("%s: %s %s (%s)", n, c.Status, c.Detail, c.Fix)
		}
	}
	ov := find(t, checks, "overlay")
	if ov.Status != OK || ov.Target != h1 || !strings.Contains(ov.Detail, "flannel.1") || !strings.Contains(ov.Detail, "underlay eth0") || !strings.Contains(ov.Detail, "2 pod veth(s)") {
		t.Errorf("overlay: %+v", ov)
	}
	if c := find(t, checks, "mtu"); c.Status != OK || c.Detail != "flannel.1 1450, underlay eth0 1500, pods 1450" {
		t.Errorf("mtu on a consistent lab: %+v", c)
	}
	if c := find(t, checks, "big-tcp"); c.Status != OK {
		t.Errorf("big-tcp on a lab without it: %+v", c)
	}
	if err := Required(checks); err != nil {
		t.Errorf("Required on a good lab: %v", err)
	}
	// Issue 28 rule (c): what sends no policy events is warned about, with its bound.
	if c := find(t, checks, "policy-events"); c.Status != OK {
		t.Errorf("policy-events on a lab with nftables only: %+v", c)
	}
	if _, err := exec.LookPath("iptables-legacy"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := netnsutil.Run(ctx, h1, "iptables-legacy", "-L", "FORWARD") // registers the legacy filter table
		cancel()
		if err != nil {
			t.Fatalf("iptables-legacy: %v: %s", err, out)
		}
		c := find(t, OverlayChecks(Target{Netns: h1}), "policy-events")
		if c.Status != Warn || !strings.Contains(c.Detail, "iptables-legacy tables in "+h1+" (filter)") || !strings.Contains(c.Detail, "within 5 s") || c.Fix == "" {
			t.Errorf("policy-events with an iptables-legacy table: %+v", c)
		}
	}

	setMTU(t, h1, "eth0", 1400)
	checks = OverlayChecks(Target{Netns: h1})
	c := find(t, checks, "mtu")
	if c.Status != Fail || !strings.Contains(c.Detail, "flannel.1 MTU 1450 + 50 bytes of VXLAN encapsulation = 1500 > underlay "+h1+"/eth0 MTU 1400") ||
		!strings.Contains(c.Fix, "lower the overlay MTU to 1350 (ip link set flannel.1 mtu 1350") || !strings.Contains(c.Fix, "raise eth0's MTU to 1500") {
		t.Errorf("mtu with the underlay at 1400: %+v", c)
	}
	if err := Required(checks); err == nil || !strings.Contains(err.Error(), "mtu") {
		t.Errorf("Required with the underlay at 1400: %v", err)
	}

	setMTU(t, h1, "eth0", 1500)
	c1 := labtest.NS(l, "h1-c1")
	setMTU(t, c1, "eth0", 1500)
	c = find(t, OverlayChecks(Target{Netns: h1}), "mtu")
	if c.Status != Fail || !strings.Contains(c.Detail, c1+"/eth0 MTU 1500 > "+h1+"/flannel.1 MTU 1450") || !strings.Contains(c.Fix, "at most 1450") {
		t.Errorf("mtu with a pod at 1500: %+v", c)
	}

	// BIG TCP on the VXLAN device is reported, with the command that turns it off.
	if _, err := netnsutil.Run(context.Background(), h1, "ip", "link", "set", "flannel.1", "gso_max_size", "131072"); err != nil {
		t.Fatal(err)
	}
	c = find(t, OverlayChecks(Target{Netns: h1}), "big-tcp")
	if c.Status != Warn || !strings.Contains(c.Detail, "gso_max_size 131072") || !strings.Contains(c.Fix, "ip netns exec "+h1+" ip link set flannel.1 gso_max_size 65536") {
		t.Errorf("big-tcp with gso_max_size 131072: %+v", c)
	}
}

// TestTxChecksumReadsTheKernel: the ioctl reading agrees with ethtool's, both ways.
func TestTxChecksumReadsTheKernel(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tdcs", Style: lab.StyleFlannel, Containers: 1})
	h1 := labtest.NS(l, "h1")
	ethtool := func() bool {
		out, err := netnsutil.Run(context.Background(), h1, "ethtool", "-k", "flannel.1")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "tx-checksum-ip-generic:"); ok {
				return strings.HasPrefix(strings.TrimSpace(v), "on")
			}
		}
		t.Fatalf("ethtool -k flannel.1 shows no tx-checksum-ip-generic:\n%s", out)
		return false
	}
	for _, state := range []string{"on", "off"} {
		if _, err := netnsutil.Run(context.Background(), h1, "ethtool", "-K", "flannel.1", "tx-checksum-ip-generic", state); err != nil {
			t.Fatal(err)
		}
		got, err := txChecksum(h1, "flannel.1")
		if err != nil {
			t.Fatal(err)
		}
		if want := ethtool(); got != want || got != (state == "on") {
			t.Errorf("set %s: ioctl reads %v, ethtool %v", state, got, want)
		}
		k, _ := kernelVersion()
		c := find(t, OverlayChecks(Target{Netns: h1}), "vxlan-tx-checksum")
		if st, _ := TxChecksumVerdict(state == "on", k); c.Status != st {
			t.Errorf("set %s on %v: check %+v, want %s", state, k, c, st)
		}
		if state == "on" && c.Status == Warn && !strings.Contains(c.Fix, "ip netns exec "+h1+" ethtool -K flannel.1 tx-checksum-ip-generic off") {
			t.Errorf("fix %q", c.Fix)
		}
	}
	if _, err := txChecksum(h1, "prg-nosuchdev"); err == nil {
		t.Error("a missing device read without error")
	}
}
