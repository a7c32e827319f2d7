package lab

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

func rxPackets(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	s, err := netnsutil.ReadFileIn(ns, "/sys/class/net/"+dev+"/statistics/rx_packets")
	if err != nil {
		t.Fatalf("%s/%s rx_packets: %v", ns, dev, err)
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	return n
}

// The overlay of a --tor lab crosses both ToRs as routed IP (the lab's own verification proves
// reachability; the ToRs' counters prove the path).
func TestToRLabRoutesTheOverlayThroughBothSwitches(t *testing.T) {
	l := upForTest(t, Spec{Name: "eztor", Style: StyleDocker, Containers: 1, ToR: true})
	if len(l.ToRs) != 2 {
		t.Fatalf("want 2 ToRs, got %+v", l.ToRs)
	}
	for i, tor := range l.ToRs {
		if tor.Role != "tor" || tor.Netns != "prg-eztor-tor"+strconv.Itoa(i+1) {
			t.Fatalf("ToR node wrong: %+v", tor)
		}
		for _, dev := range []string{ToRDown, ToRUp} {
			if d := tor.Device(dev); d == nil || d.Stage != "tor" {
				t.Fatalf("%s lacks %s (stage tor): %+v", tor.Name, dev, tor.Devices)
			}
		}
	}
	if n, err := l.Node("tor2"); err != nil || n.Role != "tor" {
		t.Fatalf("Node(tor2) = %+v, %v", n, err)
	}
	before := [2]uint64{rxPackets(t, l.ToRs[0].Netns, ToRDown), rxPackets(t, l.ToRs[1].Netns, ToRUp)}
	if err := Verify(context.Background(), l); err != nil {
		t.Fatalf("overlay through the ToRs: %v", err)
	}
	after := [2]uint64{rxPackets(t, l.ToRs[0].Netns, ToRDown), rxPackets(t, l.ToRs[1].Netns, ToRUp)}
	if after[0] <= before[0] || after[1] <= before[1] {
		t.Fatalf("overlay packets should enter tor1 from h1 and tor2 from tor1: before %v after %v", before, after)
	}
	out, err := netnsutil.Run(context.Background(), l.ToRs[0].Netns, "ip", "route", "get", "198.18.0.2")
	if err != nil || !strings.Contains(out, "via "+l.Spec.ToRAddr(2).String()) || !strings.Contains(out, "dev up") {
		t.Fatalf("tor1 should route host 2 via tor2 on up: %q %v", out, err)
	}
}

func TestToRLabThreeHostsThroughTheSpine(t *testing.T) {
	l := upForTest(t, Spec{Name: "eztor3", Style: StyleFlannel, Hosts: 3, Containers: 1, ToR: true})
	if len(l.ToRs) != 3 || l.Switch == nil {
		t.Fatalf("want 3 ToRs and the spine switch, got %d ToRs, switch %v", len(l.ToRs), l.Switch)
	}
}

func TestToRSpecLimits(t *testing.T) {
	s := Spec{Hosts: 51, ToR: true}
	s.Defaults()
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "at most 50") {
		t.Fatalf("51 hosts with ToRs should be refused, got %v", err)
	}
	d := Spec{}
	d.Defaults()
	if got := d.ToRAddr(1).String(); got != "198.18.0.254" {
		t.Fatalf("ToR 1 address = %s", got)
	}
}
