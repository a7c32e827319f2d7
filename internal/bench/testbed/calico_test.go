package testbed

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// The calico style builds Calico VXLAN's layout: the measured pods reach each other across
// vxlan.calico with no bridge on the way, the receive path's stages are the NIC, the VXLAN device
// and the pod's veth pair (no bridge stage), the underlay is NIC-like, and teardown leaves no
// namespace. Options the layout cannot honour are refused before anything is built.
func TestCalicoStyle(t *testing.T) {
	for _, bad := range []Spec{{Style: StyleCalico, ToR: true}, {Style: StyleCalico, SameNode: true},
		{Style: StyleCalico, ProxyMode: "iptables"}, {Style: StyleCalico, IPv6: true}, {Style: StyleCalico, NAPIThread: true}} {
		if _, err := Up(context.Background(), bad, t.Logf); err == nil {
			t.Errorf("%+v: not refused", bad)
		}
	}
	testutil.RequireRoot(t)
	s := Spec{Index: 7, Config: "calico/vanilla", Style: StyleCalico, Containers: 1, RxCPUs: []int{0}, Background: true}
	prefix := fmt.Sprintf("prg-b%dx7-", os.Getpid()%100000)
	t.Cleanup(func() { _ = downCalico(labName(7)); testutil.AssertClean(t, prefix) })
	tb, err := Up(context.Background(), s, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Receiver.AddrOnly() != "10.65.2.2" || tb.Sender.Netns != prefix+"n1-p1" || tb.BGReceiver.Netns != prefix+"n2-p2" {
		t.Errorf("pair %+v -> %+v, background -> %+v", tb.Sender, tb.Receiver, tb.BGReceiver)
	}
	want := map[string]string{prefix + "n2/eth0": "nic", prefix + "n2/vxlan.calico": "vxlan",
		prefix + "n2/" + calicoVeth(2, 1): "veth-host", prefix + "n2/" + calicoVeth(2, 2): "veth-host", prefix + "n2-p1/eth0": "veth"}
	if !maps.Equal(tb.Stages, want) {
		t.Errorf("stages %v, want %v", tb.Stages, want)
	}
	if f := tb.Offloads["n2/eth0"]; !f["gro"] || f["tx-csum"] {
		t.Errorf("receiving node's eth0 is not NIC-like (GRO on, tx checksums off): %v", f)
	}
	if tb.ReceiveHostNetns() != prefix+"n2" {
		t.Errorf("receive host %q", tb.ReceiveHostNetns())
	}
	for _, p := range []string{"n1-p2", "n2-p2"} { // the background pair crosses too
		peer := map[string]string{"n1-p2": "10.65.2.3", "n2-p2": "10.65.1.3"}[p]
		if _, err := netnsutil.Run(context.Background(), prefix+p, "ping", "-c", "1", "-W", "2", peer); err != nil {
			t.Errorf("%s -> %s: %v", p, peer, err)
		}
	}
	// The normal path is Calico's: routed through the pod veth's proxy ARP, no bridge anywhere.
	out, _ := netnsutil.Run(context.Background(), prefix+"n1-p1", "ip", "neigh", "show", "169.254.1.1")
	if !strings.Contains(out, calicoMAC) {
		t.Errorf("the pod's gateway is not answered by proxy ARP with %s: %q", calicoMAC, out)
	}
	for _, ns := range []string{prefix + "n1", prefix + "n2"} {
		if out, _ := netnsutil.Run(context.Background(), ns, "ip", "-o", "link", "show", "type", "bridge"); strings.TrimSpace(out) != "" {
			t.Errorf("%s has a bridge: %s", ns, out)
		}
	}
	nss := tb.Namespaces()
	if len(nss) != 6 || !slices.Contains(nss, prefix+"n2-p2") {
		t.Errorf("namespaces %v", nss)
	}
	if err := tb.Teardown(); err != nil {
		t.Fatal(err)
	}
	testutil.AssertClean(t, prefix)
}
