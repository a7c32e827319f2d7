package doctor

import (
	"bytes"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

func TestParseRelease(t *testing.T) {
	for _, c := range []struct {
		rel  string
		want Version
	}{
		{"6.18.44-fc-v782", Version{6, 18, 44}},
		{"5.14.0-362.8.1.el9_3.x86_64", Version{5, 14, 0}},
		{"6.1", Version{6, 1, 0}},
		{"6.8.0-49-generic", Version{6, 8, 0}},
		{"4.19.0+", Version{4, 19, 0}},
		{"6.12.", Version{6, 12, 0}},
	} {
		got, err := ParseRelease(c.rel)
		if err != nil || got != c.want {
			t.Errorf("ParseRelease(%q) = %v, %v; want %v", c.rel, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "6", "linux-6.1", "6..1", "x.y", "99999999999.1"} {
		if v, err := ParseRelease(bad); err == nil {
			t.Errorf("ParseRelease(%q) = %v, want an error", bad, v)
		}
	}
}

func TestAtLeast(t *testing.T) {
	v := Version{6, 12, 3}
	for _, c := range []struct {
		major, minor int
		want         bool
	}{{6, 12, true}, {6, 6, true}, {5, 20, true}, {6, 13, false}, {7, 0, false}} {
		if got := v.AtLeast(c.major, c.minor); got != c.want {
			t.Errorf("%v.AtLeast(%d, %d) = %v", v, c.major, c.minor, got)
		}
	}
}

func TestCapabilities(t *testing.T) {
	eff, err := ParseCapEff("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n")
	if err != nil || eff != 0x1ffffffffff {
		t.Fatalf("ParseCapEff = %x, %v", eff, err)
	}
	if _, err := ParseCapEff("CapPrm:\t1\n"); err == nil {
		t.Error("a status without CapEff parsed")
	}
	if _, err := ParseCapEff("CapEff:\tzz\n"); err == nil {
		t.Error("a bad CapEff parsed")
	}
	all := uint64(1<<capNetAdmin | 1<<capSysAdmin | 1<<capSysChroot | 1<<capBPF | 1<<capPerfmon | 1<<capSysResource)
	if st, _, _ := capVerdict(all, Version{6, 6, 0}); st != OK {
		t.Errorf("every capability: %s", st)
	}
	st, detail, fix := capVerdict(all&^(1<<capSysAdmin), Version{6, 6, 0})
	if st != Fail || !strings.Contains(detail, "missing SYS_ADMIN") || fix == "" {
		t.Errorf("without SYS_ADMIN: %s %q %q", st, detail, fix)
	}
	st, detail, _ = capVerdict(all&^(1<<capSysChroot), Version{6, 6, 0})
	if st != Fail || !strings.Contains(detail, "missing SYS_CHROOT") {
		t.Errorf("without SYS_CHROOT (setns back into the mount namespace): %s %q", st, detail)
	}
	if st, _, _ := capVerdict(all&^(1<<capSysResource), Version{6, 6, 0}); st != OK {
		t.Errorf("without SYS_RESOURCE on 6.6 (memcg accounting): %s", st)
	}
	if st, _, _ := capVerdict(all&^(1<<capSysResource), Version{5, 10, 0}); st != Warn {
		t.Errorf("without SYS_RESOURCE on 5.10 (memlock): %s", st)
	}
	if st, _, _ := capVerdict(0, Version{6, 6, 0}); st != Fail {
		t.Errorf("no capabilities: %s", st)
	}
}

// flannel is a flannel-style path: flannel.1 routed to cni0, on eth0, one pod.
func flannel(vxMTU, nicMTU, podMTU int) []devInfo {
	const ns = "prg-x-h1"
	return []devInfo{
		{Dev: datapath.Dev{Netns: ns, Name: "eth0", Ifindex: 2, Stage: datapath.StageNIC}, MTU: nicMTU},
		{Dev: datapath.Dev{Netns: ns, Name: "flannel.1", Ifindex: 3, Stage: datapath.StageVXLAN}, MTU: vxMTU, VtepDev: 2},
		{Dev: datapath.Dev{Netns: ns, Name: "veth1", Ifindex: 5, Stage: datapath.StageVethHost, Master: "cni0", Peer: "prg-x-c1/eth0"}, MTU: podMTU},
		{Dev: datapath.Dev{Netns: "prg-x-c1", Name: "eth0", Ifindex: 2, Stage: datapath.StageVeth, Peer: ns + "/veth1"}, MTU: podMTU},
	}
}

func TestMTUProblems(t *testing.T) {
	if p, f, _ := mtuProblems(flannel(1450, 1500, 1450)); len(p) != 0 || len(f) != 0 {
		t.Errorf("a consistent path: %v %v", p, f)
	}
	if p, _, _ := mtuProblems(flannel(8950, 9000, 1450)); len(p) != 0 {
		t.Errorf("pods below the VXLAN MTU are fine (only wasteful): %v", p)
	}
	p, f, _ := mtuProblems(flannel(1450, 1400, 1450))
	if len(p) != 1 || !strings.Contains(p[0], "1450 + 50") || !strings.Contains(p[0], "MTU 1400") {
		t.Errorf("underlay 1400 under VXLAN 1450: %v", p)
	}
	if len(f) != 1 || !strings.Contains(f[0], "lower the overlay MTU to 1350") || !strings.Contains(f[0], "raise eth0's MTU to 1500") {
		t.Errorf("fix %v", f)
	}
	// An IPv6 underlay takes 20 bytes more.
	v6 := flannel(1450, 1500, 1450)
	v6[1].IPv6 = true
	if p, f, _ := mtuProblems(v6); len(p) != 1 || !strings.Contains(f[0], "to 1430") {
		t.Errorf("IPv6 underlay: %v %v", p, f)
	}
	// A pod above the VXLAN device: both veth ends are reported, the fix once.
	p, f, _ = mtuProblems(flannel(1450, 1500, 1500))
	if len(p) != 2 || len(f) != 1 || !strings.Contains(f[0], "at most 1450") {
		t.Errorf("pods at 1500 over VXLAN 1450: %v %v", p, f)
	}
	// A VXLAN device created without a device (routed): every underlay counts.
	routed := flannel(1450, 1500, 1450)
	routed[1].VtepDev = 0
	routed = append(routed, devInfo{Dev: datapath.Dev{Netns: "prg-x-h1", Name: "eth1", Ifindex: 9, Stage: datapath.StageNIC}, MTU: 1480})
	if p, _, _ := mtuProblems(routed); len(p) != 1 || !strings.Contains(p[0], "eth1") {
		t.Errorf("routed VXLAN with a small second underlay: %v", p)
	}
}

// TestMTUDualStackIPv6Underlay: flannel's dual-stack over an IPv6 underlay gives the pods
// flannel.1's MTU (1450) and flannel-v6.1 1430: a note (IPv6 above 1430 gets Packet Too Big),
// not a problem that would keep the agent unready; a pod above flannel.1 too stays a problem.
func TestMTUDualStackIPv6Underlay(t *testing.T) {
	links := append(flannel(1450, 1500, 1450),
		devInfo{Dev: datapath.Dev{Netns: "prg-x-h1", Name: "flannel-v6.1", Ifindex: 4, Stage: datapath.StageVXLAN}, MTU: 1430, VtepDev: 2, IPv6: true})
	p, _, n := mtuProblems(links)
	if len(p) != 0 || len(n) != 2 || !strings.Contains(n[0], "Packet Too Big") || !strings.Contains(n[0], "1430") {
		t.Errorf("dual-stack, pods at 1450: problems %v, notes %v", p, n)
	}
	if c := mtuCheck("h1", links); c.Status != Warn {
		t.Errorf("check: %s %q", c.Status, c.Detail)
	}
	links[2].MTU, links[3].MTU = 1500, 1500
	if p, _, _ := mtuProblems(links); len(p) != 4 {
		t.Errorf("pods at 1500, above both devices: %v", p)
	}
	// Without an IPv4 overlay beside it, an IPv6-underlay device's MTU binds.
	only6 := flannel(1430, 1500, 1450)
	only6[1].IPv6 = true
	if p, _, _ := mtuProblems(only6); len(p) != 2 {
		t.Errorf("IPv6 underlay only, pods at 1450 over 1430: %v", p)
	}
}

// TestMTUDockerTenants: pods are compared with the VXLAN device on their own bridge, not with
// another tenant's.
func TestMTUDockerTenants(t *testing.T) {
	links := []devInfo{
		{Dev: datapath.Dev{Name: "eth0", Ifindex: 2, Stage: datapath.StageNIC}, MTU: 9000},
		{Dev: datapath.Dev{Netns: "ov1", Name: "vxlan0", Stage: datapath.StageVXLAN, Master: "br0"}, MTU: 1450},
		{Dev: datapath.Dev{Netns: "ov2", Name: "vxlan0", Stage: datapath.StageVXLAN, Master: "br0"}, MTU: 8950},
		{Dev: datapath.Dev{Netns: "ov1", Name: "veth0", Stage: datapath.StageVethHost, Master: "br0", Peer: "c1/eth0"}, MTU: 1450},
		{Dev: datapath.Dev{Netns: "c1", Name: "eth0", Stage: datapath.StageVeth, Peer: "ov1/veth0"}, MTU: 1450},
		{Dev: datapath.Dev{Netns: "ov2", Name: "veth0", Stage: datapath.StageVethHost, Master: "br0", Peer: "c2/eth0"}, MTU: 8950},
		{Dev: datapath.Dev{Netns: "c2", Name: "eth0", Stage: datapath.StageVeth, Peer: "ov2/veth0"}, MTU: 8950},
	}
	if p, _, _ := mtuProblems(links); len(p) != 0 {
		t.Errorf("each tenant consistent: %v", p)
	}
	links[6].MTU = 9000
	if p, _, _ := mtuProblems(links); len(p) != 1 || !strings.Contains(p[0], "c2/eth0 MTU 9000 > ov2/vxlan0 MTU 8950") {
		t.Errorf("tenant 2's pod above its VXLAN: %v", p)
	}
}

func TestTxChecksumVerdict(t *testing.T) {
	for _, c := range []struct {
		on   bool
		k    Version
		want Status
	}{
		{true, Version{6, 12, 0}, Warn},
		{true, Version{6, 18, 44}, Warn},
		{true, Version{6, 11, 9}, OK},
		{false, Version{6, 18, 0}, OK},
		{true, Version{5, 4, 0}, Warn},
		{false, Version{5, 4, 0}, OK},
	} {
		st, why := TxChecksumVerdict(c.on, c.k)
		if st != c.want || (st == Warn) != (why != "") {
			t.Errorf("on=%v kernel %v: %s %q, want %s", c.on, c.k, st, why, c.want)
		}
	}
}

func TestBigTCP(t *testing.T) {
	if b := BigTCP([]uint32{65536, 65536, 65536, 65536}); len(b) != 0 {
		t.Errorf("defaults: %v", b)
	}
	b := BigTCP([]uint32{185000, 65536, 65536, 131072})
	if len(b) != 2 || b[0] != "gro_ipv4_max_size 131072" || b[1] != "gso_max_size 185000" {
		t.Errorf("BIG TCP on: %v", b)
	}
}

func TestRequiredAndWrite(t *testing.T) {
	checks := []Check{
		{Name: "kernel", Status: OK, Detail: "6.18"},
		{Name: "tracefs", Status: Warn, Detail: "not mounted", Fix: "mount it"},
		{Name: "mtu", Target: "prg-x-h1", Status: Fail, Detail: "too big", Fix: "lower it"},
		{Name: "big-tcp", Target: "prg-x-h1", Status: Skip, Detail: "no overlay"},
	}
	err := Required(checks)
	if err == nil || !strings.Contains(err.Error(), "1 required check(s) failed: prg-x-h1 mtu: too big") {
		t.Errorf("Required = %v", err)
	}
	if err := Required(checks[:2]); err != nil {
		t.Errorf("a warning is not required: %v", err)
	}
	var b bytes.Buffer
	if err := Write(&b, checks); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"mtu (prg-x-h1)", "FAIL", "-> lower it", "-> mount it", "1 ok, 1 warn, 1 fail, 1 skipped"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestInNetns(t *testing.T) {
	for ns, want := range map[string]string{
		"":                           "ethtool -k x",
		"prg-lab-h1":                 "ip netns exec prg-lab-h1 ethtool -k x",
		"/var/run/docker/netns/1-ab": "nsenter --net=/var/run/docker/netns/1-ab ethtool -k x",
	} {
		if got := inNetns(ns, "ethtool -k x"); got != want {
			t.Errorf("inNetns(%q) = %q", ns, got)
		}
	}
}
