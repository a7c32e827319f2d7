package ezpath

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

const (
	tenantEchoPort = 5301 // every h2 container: answers "<banner>\n", then echoes
	tenantOnlyPort = 5302 // tenant 2's h2 container only
)

// serveBanner listens on addr:port inside ns; each connection gets banner and a newline, then
// its own bytes back.
func serveBanner(t *testing.T, ns, addr string, port int, banner string) {
	t.Helper()
	labtest.EchoNamed(t, ns, net.JoinHostPort(addr, fmt.Sprint(port)), banner, 5*time.Second)
}

// ask connects from inside ns to addr:port, reads the banner and has a message echoed.
func ask(ns, addr string, port int) (string, error) {
	c, err := netnsutil.DialContext(context.Background(), ns, &net.Dialer{Timeout: time.Second}, "tcp4", net.JoinHostPort(addr, fmt.Sprint(port)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	r, banner, err := labtest.ReadGreeting(c)
	if err != nil {
		return "", fmt.Errorf("banner: %w", err)
	}
	msg := strings.Repeat("x", 3000) + "\n" // more than one segment
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	back, err := r.ReadString('\n')
	if err != nil || back != msg {
		return "", fmt.Errorf("echo: %d of %d bytes back, %v", len(back), len(msg), err)
	}
	return banner, nil
}

// Two tenants with the same addresses on one rack: each tenant's h1-c1 reaches its own h2-c1
// (the banner names the tenant) with and without offload, including when both tenants' pairs
// (same inner addresses) are offloaded at once; tenant 1 never reaches tenant 2.
func TestTenantsShareAddressesButNotTraffic(t *testing.T) {
	l := torLabSpec(t, lab.Spec{Name: "eztn", Style: lab.StyleDocker, Containers: 1, ToR: true, Tenants: 2}, map[string]string{OptPolicy: "manual"})
	c1, c2 := map[int]*lab.Node{}, map[int]*lab.Node{}
	for _, tn := range []int{1, 2} {
		a, err := l.Node(lab.ContainerName(1, tn, 1))
		must(t, err)
		b, err := l.Node(lab.ContainerName(2, tn, 1))
		must(t, err)
		c1[tn], c2[tn] = a, b
		serveBanner(t, b.Netns, b.AddrOnly(), tenantEchoPort, fmt.Sprintf("tenant-%d", tn))
	}
	if c2[1].AddrOnly() != c2[2].AddrOnly() {
		t.Fatalf("the tenants should share addresses: %s %s", c2[1].Addr, c2[2].Addr)
	}
	serveBanner(t, c2[2].Netns, c2[2].AddrOnly(), tenantOnlyPort, "tenant-2-only")
	dst := c2[1].AddrOnly()
	check := func(phase string) {
		t.Helper()
		for _, tn := range []int{1, 2} {
			got, err := ask(c1[tn].Netns, dst, tenantEchoPort)
			if err != nil || got != fmt.Sprintf("tenant-%d", tn) {
				t.Fatalf("%s: %s -> %s:%d answered %q (%v), want tenant-%d", phase, c1[tn].Name, dst, tenantEchoPort, got, err, tn)
			}
		}
		if got, err := ask(c1[1].Netns, dst, tenantOnlyPort); err == nil {
			t.Fatalf("%s: tenant 1's h1-c1 reached tenant 2's port (%q)", phase, got)
		}
	}
	check("overlay")

	// Overlay addresses name one container per tenant: the CLI's API wants names.
	if err := Offload("eztn", "198.19.1.2", "198.19.2.2", "manual"); err == nil || !strings.Contains(err.Error(), "ambiguous") || !strings.Contains(err.Error(), "h1-t2-c1 (tenant 2)") {
		t.Fatalf("an overlay address shared by tenants should be refused as ambiguous, got %v", err)
	}
	if err := Offload("eztn", "h1-c1", "h2-t2-c1", "manual"); err == nil || !strings.Contains(err.Error(), "different tenants") {
		t.Fatalf("a pair across tenants should be refused, got %v", err)
	}

	// Tenant 2's pair on the switch path: VID 101 on the host link, VNI 4097 between the ToRs.
	must(t, Offload("eztn", "h1-t2-c1", "h2-t2-c1", "manual"))
	onLink := capture(t, "prg-eztn-tor1", lab.ToRDown, func() { ping(t, l, "h1-t2-c1", "h2-t2-c1") })
	if !strings.Contains(onLink, "vlan 101") || !strings.Contains(onLink, "198.19.1.2 > 198.19.2.2: ICMP echo request") {
		t.Fatalf("tenant 2's frames should cross the host-ToR link tagged with VID 101:\n%s", onLink)
	}
	between := capture(t, "prg-eztn-tor2", lab.ToRUp, func() { ping(t, l, "h1-t2-c1", "h2-t2-c1") })
	if !strings.Contains(between, "198.18.0.254.") || !strings.Contains(between, "vni 4097") {
		t.Fatalf("tenant 2's offloaded pair should be tunnelled between the ToRs with VNI 4097:\n%s", between)
	}
	overlay := capture(t, "prg-eztn-tor2", lab.ToRUp, func() { ping(t, l, "h1-c1", "h2-c1") })
	if !strings.Contains(overlay, "198.18.0.1.") || !strings.Contains(overlay, "vni 4096") {
		t.Fatalf("tenant 1's pair (same addresses) should stay on the overlay, VNI 4096:\n%s", overlay)
	}
	check("tenant 2 offloaded")

	// Both tenants' pairs offloaded: the same inner addresses in the same switch tables.
	must(t, Offload("eztn", "h1-c1", "h2-c1", "manual"))
	check("both offloaded")
	if err := lab.Verify(context.Background(), l); err != nil {
		t.Fatalf("lab verification with both tenants offloaded: %v", err)
	}
	for i := 1; i <= 2; i++ {
		hs, ts := stats(t, l, i)
		if hs["tagged"] == 0 || hs["delivered"] == 0 || ts["encap"] == 0 || ts["decap"] == 0 {
			t.Fatalf("h%d counters: host %v tor %v", i, hs, ts)
		}
		if hs["miss_pod"]+hs["miss_vid"]+hs["errors"]+ts["miss_vni"]+ts["miss_encap"]+ts["miss_decap"]+ts["errors"] != 0 {
			t.Fatalf("h%d dropped frames: host %v tor %v", i, hs, ts)
		}
	}
	r, err := openRack("eztn")
	must(t, err)
	tt, err := openTorTables(r.torDir(1))
	must(t, err)
	n := countEntries(tt.EzpEncap)
	var vni uint32
	errVNI := tt.EzpVlanToVni.Lookup(torEzpPortVid{Ifindex: uint32(r.downIfindex(1)), Vid: 101}, &vni)
	tt.Close()
	if n != 2 || errVNI != nil || vni != 4097 {
		t.Fatalf("tor1: %d encap entries (want one per tenant for the same address), (down, VID 101) -> VNI %d %v", n, vni, errVNI)
	}
	views, err := Flows("eztn", 200*time.Millisecond)
	must(t, err)
	for _, v := range views {
		if v.Key.VNI == 4097 && !strings.Contains(v.Src+v.Dst, "-t2-") || v.Key.VNI == 4096 && strings.Contains(v.Src+v.Dst, "-t2-") {
			t.Fatalf("flow %s named by the wrong tenant: %s -> %s", v.Key, v.Src, v.Dst)
		}
	}

	// Back to the overlay, one tenant at a time.
	must(t, Unoffload("eztn", "h1-t2-c1", "h2-t2-c1", 50*time.Millisecond))
	check("tenant 1 offloaded")
	must(t, Unoffload("eztn", "h1-c1", "h2-c1", 50*time.Millisecond))
	check("overlay again")

	// Detach removes every tenant's relay.
	for _, h := range l.Hosts {
		_, err := datapath.Detach(context.Background(), h.Netns, "")
		must(t, err)
		if out, _ := netnsutil.Run(context.Background(), h.Netns, "ip", "-br", "link"); strings.Contains(out, RelayDev) {
			t.Fatalf("%s still has a relay after detach:\n%s", h.Netns, out)
		}
	}
	for _, ov := range l.Overlays {
		if out, _ := netnsutil.Run(context.Background(), ov.Netns, "ip", "-br", "link"); strings.Contains(out, RelayDev) {
			t.Fatalf("%s still has a relay after detach:\n%s", ov.Netns, out)
		}
	}
	check("detached")
}

func TestTenantEndpointNames(t *testing.T) {
	spec := lab.Spec{Name: "x", Tenants: 2, ToR: true}
	spec.Defaults()
	l := &lab.Lab{Spec: spec}
	r := &rack{hw: lab.RackOf(l), tenants: 2}
	for _, n := range []string{"h1-c1", "h2-c1", "h1-t2-c1", "h2-t2-c1"} {
		i, tn, j, _ := lab.ParseContainerName(n)
		r.eps = append(r.eps, endpoint{Name: n, Host: i, Tenant: tn, Addr: spec.ContainerAddr(i, j).Addr(), Veth: "veth1"})
	}
	if e, err := r.endpoint("h2-t2-c1"); err != nil || e.Tenant != 2 || e.Host != 2 {
		t.Fatalf("by name: %+v %v", e, err)
	}
	if _, err := r.endpoint("198.19.2.2"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Fatalf("an address of both tenants is ambiguous, got %v", err)
	}
	if e, ok := r.endpointAt(2, spec.ContainerAddr(1, 1).Addr()); !ok || e.Name != "h1-t2-c1" {
		t.Fatalf("endpointAt(2, 198.19.1.2) = %+v", e)
	}
	if r.tenantOfVNI(4097) != 2 || r.tenantOfVNI(4096) != 1 || r.tenantOfVNI(4098) != 0 {
		t.Fatal("tenantOfVNI")
	}
	if RelayHostDev(1) != "ezp0" || RelayHostDev(2) != "ezp0-t2" || TenantVIDOf(2) != 101 {
		t.Fatal("relay names / VIDs")
	}
	if r.hostOf("h2-t2-c1") != 2 || r.hostOf("h1-c1") != 1 || r.hostOf("tor1") != 0 {
		t.Fatal("hostOf")
	}
	// The switches' flow registers carry the VNI: it tells which tenant's containers a flow is
	// between, and the offloaded state belongs to that tenant's pair only.
	a, b := spec.ContainerAddr(1, 1).Addr(), spec.ContainerAddr(2, 1).Addr()
	counts := []FlowCount{
		{Key: FlowKey{VNI: 4097, Src: a, Dst: b, Proto: 6, SPort: 1, DPort: 2}, Bytes: 100},
		{Key: FlowKey{VNI: 4096, Src: b, Dst: a, Proto: 6, SPort: 2, DPort: 1}, Bytes: 100},
		{Key: FlowKey{VNI: 4098, Src: a, Dst: b, Proto: 6, SPort: 1, DPort: 2}, Bytes: 100}, // no tenant
	}
	led := &Ledger{Pairs: []Pair{{A: "h1-t2-c1", B: "h2-t2-c1"}}}
	views, stats := r.view(counts, led, Classes{}, func(FlowKey, uint64) float64 { return 1 })
	if len(views) != 2 || len(stats) != 2 {
		t.Fatalf("want the two tenants' flows as two pairs: %+v %+v", views, stats)
	}
	for _, v := range views {
		want := map[uint32][3]string{4097: {"h1-t2-c1", "h2-t2-c1", "offloaded"}, 4096: {"h2-c1", "h1-c1", "overlay"}}[v.Key.VNI]
		if v.Src != want[0] || v.Dst != want[1] || v.State != want[2] {
			t.Fatalf("flow %s: %s -> %s %s, want %v", v.Key, v.Src, v.Dst, v.State, want)
		}
		if v.Key.VNI == 4097 && !strings.Contains(v.Where, "tag 101") {
			t.Fatalf("tenant 2's path should show its VID: %s", v.Where)
		}
	}
	single := &rack{hw: lab.RackOf(&lab.Lab{Spec: lab.Spec{Name: "y", VNI: 4096}}), tenants: 1, eps: r.eps[:2]}
	if e, err := single.endpoint("198.19.2.2"); err != nil || e.Name != "h2-c1" {
		t.Fatalf("one tenant: an address names its container: %+v %v", e, err)
	}
}
