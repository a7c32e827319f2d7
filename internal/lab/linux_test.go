package lab

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

func TestLinuxStyleSpec(t *testing.T) {
	s := Spec{Style: StyleLinux, Containers: 3}
	s.Defaults()
	if err := s.Validate(); err != nil {
		t.Fatalf("linux spec should validate: %v", err)
	}
	if s.Containers != 0 {
		t.Errorf("linux style builds no containers, spec says %d", s.Containers)
	}
	if s.VXLANPort != 4789 || s.OverlayMTU() != 1450 {
		t.Errorf("linux style: port %d, overlay MTU %d; want 4789, 1450", s.VXLANPort, s.OverlayMTU())
	}
	if got := s.LinuxAddr(2).String(); got != "198.19.2.2/16" {
		t.Errorf("linux overlay address of h2 = %s, want 198.19.2.2/16", got)
	}
	// The injector computes inner frames from ContainerAddr/ContainerMAC(i, 1): the linux
	// style's vxlan0 must answer to exactly those.
	if s.LinuxAddr(2).Addr() != s.ContainerAddr(2, 1).Addr() || s.LinuxMAC(2).String() != s.ContainerMAC(2, 1).String() {
		t.Errorf("linux vxlan0 of h2 (%s, %s) differs from the first-endpoint address/MAC (%s, %s)",
			s.LinuxAddr(2), s.LinuxMAC(2), s.ContainerAddr(2, 1), s.ContainerMAC(2, 1))
	}
	if !HostEndpoints(StyleLinux) || HostEndpoints(StyleDocker) {
		t.Error("HostEndpoints: linux runs applications on hosts, docker in containers")
	}
}

func TestLinuxStyleLayout(t *testing.T) {
	l := upForTest(t, Spec{Name: "tlnx", Style: StyleLinux, Hosts: 3})
	if len(l.Containers) != 0 || len(l.Overlays) != 0 {
		t.Fatalf("linux style must have no containers or overlay namespaces: %d, %d", len(l.Containers), len(l.Overlays))
	}
	eps := l.Endpoints()
	if len(eps) != 3 {
		t.Fatalf("endpoints = %d, want the 3 hosts", len(eps))
	}
	ctx := context.Background()
	for i, h := range eps {
		want := l.Spec.LinuxAddr(i + 1).String()
		if h.Role != "host" || h.Addr != want {
			t.Fatalf("endpoint %d: %s %s %s, want a host with overlay address %s", i, h.Name, h.Role, h.Addr, want)
		}
		vx := h.Device(LinuxVXLAN)
		if vx == nil || vx.Kind != "vxlan" || vx.Port != 4789 || vx.VNI != 4096 || vx.MTU != 1450 || vx.Master != "" || vx.Stage != "vxlan" {
			t.Fatalf("%s: vxlan0 (VNI 4096, port 4789, MTU 1450, no master) expected, got %+v", h.Name, vx)
		}
		if len(vx.Addrs) != 1 || vx.Addrs[0] != want {
			t.Fatalf("%s: vxlan0 addresses %v, want [%s]", h.Name, vx.Addrs, want)
		}
		for _, d := range h.Devices {
			if d.Kind == "bridge" || (d.Kind == "veth" && d.Name != "eth0") {
				t.Fatalf("%s: linux style must have no bridge or container veth, found %s (%s)", h.Name, d.Name, d.Kind)
			}
		}
		// Static FDB: every other host's vxlan0 MAC points at its underlay address.
		fdb, err := netnsutil.Run(ctx, h.Netns, "bridge", "fdb", "show", "dev", LinuxVXLAN)
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= 3; k++ {
			if k == i+1 {
				continue
			}
			entry := l.Spec.LinuxMAC(k).String() + " dst " + l.Spec.HostAddr(k).Addr().String()
			if !strings.Contains(fdb, entry) {
				t.Fatalf("%s: fdb lacks %q:\n%s", h.Name, entry, fdb)
			}
		}
	}
	// Traffic between overlay addresses is encapsulated: it leaves by vxlan0 and arrives on it.
	h1, h3 := eps[0], eps[2]
	route, err := netnsutil.Run(ctx, h1.Netns, "ip", "route", "get", h3.AddrOnly())
	if err != nil || !strings.Contains(route, "dev "+LinuxVXLAN) {
		t.Fatalf("route from h1 to %s should use vxlan0: %q %v", h3.AddrOnly(), route, err)
	}
	before := vxlanRxPackets(t, h3.Netns)
	if err := Verify(ctx, l); err != nil {
		t.Fatalf("connectivity: %v", err)
	}
	if after := vxlanRxPackets(t, h3.Netns); after < before+4 {
		t.Fatalf("vxlan0 of h3 received %d packets during the all-pairs check, want at least 4 (TCP and UDP from 2 hosts)", after-before)
	}
}

func vxlanRxPackets(t *testing.T, ns string) uint64 {
	t.Helper()
	s, err := netnsutil.ReadFileIn(ns, "/sys/class/net/"+LinuxVXLAN+"/statistics/rx_packets")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
