package fastpath

import (
	"strings"
	"testing"
)

// Same-node hits are part of the hits, shown beside them, and neither a fallback nor a
// reason of their own in the fallback list; "nat" is a fallback.
func TestFormatLocalAndNAT(t *testing.T) {
	v := &View{Layout: LayoutRouted, Egress: Direction{"hit": 100, "local": 40, "miss": 2, "nat": 7, "learned": 3}, Ingress: Direction{"hit": 60}}
	out := v.Format()
	if !strings.Contains(out, "hits 100 (40 to pods on this node), misses 2, learned 3, fallbacks 7 (nat 7)") {
		t.Fatalf("egress line:\n%s", out)
	}
	if strings.Contains(out, "local 40") || v.Egress.Fallbacks() != 7 {
		t.Fatalf("local counted as a fallback (%d):\n%s", v.Egress.Fallbacks(), out)
	}
	if !strings.Contains(out, "fastpath ingress: hits 60, misses 0") {
		t.Fatalf("ingress line:\n%s", out)
	}
	if Reasons[baseReasons-1] != "closed-lost" || Reasons[baseReasons] != "closed-ct" || Reasons[len(Reasons)-1] != "no-src" {
		t.Fatalf("Reasons must follow FP_R_* (FP_R_CLOSED_LOST last of FP_R_N, FP_R_CLOSED_CT first of stat2, FP_R_NOSRC last): %v", Reasons)
	}
	// The counter array is sized by FP_R_N: as many reasons as the programs count.
	spec, err := loadFp()
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps["prg_fastpath_stat"].MaxEntries; got != uint32(maxOverlays*2*baseReasons) {
		t.Fatalf("prg_fastpath_stat holds %d counters, want %d reasons per direction and overlay", got, baseReasons)
	}
	// prg_fastpath_stat2 keeps the size attachments made with it pinned (closed-ct alone), so
	// an upgrade in place reuses it; the reasons after it go to prg_fastpath_stat3, whose
	// room (FP_R3_CAP) is pinned the same way from its first attachment on.
	if got := spec.Maps["prg_fastpath_stat2"].MaxEntries; got != uint32(maxOverlays*2*1) || stat2Reasons != 1 || Reasons[baseReasons] != "closed-ct" {
		t.Fatalf("prg_fastpath_stat2 holds %d counters, want the 1 reason (closed-ct) per direction and overlay it was attached with", got)
	}
	if got := spec.Maps["prg_fastpath_stat3"].MaxEntries; got != uint32(maxOverlays*2*stat3Cap) || len(Reasons)-baseReasons-stat2Reasons > stat3Cap {
		t.Fatalf("prg_fastpath_stat3 holds %d counters, want %d slots per direction and overlay for %d reasons", got, stat3Cap, len(Reasons)-baseReasons-stat2Reasons)
	}
	// prg_fastpath_stat keeps the size attachments made before the later reasons pinned
	// (22 reasons: up to closed-lost), so an upgrade in place reuses it.
	if baseReasons != 22 || Reasons[baseReasons-1] != "closed-lost" {
		t.Fatalf("prg_fastpath_stat's reasons changed: %v", Reasons[:baseReasons])
	}
}

// Format lists every overlay with its counters and live pods, and says when one is off.
func TestFormatOverlays(t *testing.T) {
	v := &View{Agent: "pid 1, running", Flows: 3, Both: 2,
		Egress: Direction{"hit": 7}, Ingress: Direction{"hit": 5},
		Overlays: []OverlayView{
			{Index: 0, Layout: LayoutBridged, VXLAN: "/run/d/netns/1-a/vxlan0", Underlay: "n1/eth0", VNI: 4096, Port: 4789, VTEP: "10.0.0.1", On: true,
				Egress: Direction{"hit": 3}, Ingress: Direction{"hit": 2}, Pods: []PodView{{Addr: "10.0.0.11", Veth: "veth1"}}},
			{Index: 1, Layout: LayoutBridged, VXLAN: "/run/d/netns/1-b/vxlan0", Underlay: "n1/eth0", VNI: 4097, Port: 4789, VTEP: "10.0.0.1",
				Egress: Direction{"hit": 4}, Ingress: Direction{"hit": 3}},
		}}
	out := v.Format()
	for _, want := range []string{
		"fastpath: 2 overlay(s); 3 flows cached, 2 learned both ways",
		"overlay 0: bridged layout, /run/d/netns/1-a/vxlan0 over n1/eth0 (vni 4096, port 4789, vtep 10.0.0.1):",
		"pods (live): 10.0.0.11 (veth1)",
		"overlay 1: bridged layout, /run/d/netns/1-b/vxlan0 over n1/eth0 (vni 4097, port 4789, vtep 10.0.0.1) (off: its device is gone)",
		"pods (live): none",
		"egress hits 4, misses 0, fallbacks 0; ingress hits 3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// The counter keys' layout must match pcnt_key and pcnt6_key in bpf/: an IPv6 key's overlay must
// not carry FP_PCNT6, and its fold must never be taken for an IPv4 address (forgetEndpoints would
// drop an IPv6 pod's budget when an IPv4 pod whose address equals the fold changes).
func TestPcntKey(t *testing.T) {
	for _, c := range []struct {
		k    uint64
		ovl  int
		low  uint32
		ipv4 bool
	}{
		{3<<32 | 0x0a000002, 3, 0x0a000002, true},
		{fpPcnt6 | 3<<32 | 0x0a000002, 3, 0x0a000002, false},
		{fpPcnt6 | 0xffff<<32 | 1, 0xffff, 1, false},
	} {
		ovl, low, ipv4 := pcntKey(c.k)
		if ovl != c.ovl || low != c.low || ipv4 != c.ipv4 {
			t.Errorf("pcntKey(%#x) = %d, %#x, %v; want %d, %#x, %v", c.k, ovl, low, ipv4, c.ovl, c.low, c.ipv4)
		}
	}
	// pcnt6Key mirrors pcnt6_key (the IPv6 prog tests look counters up with it).
	if ovl, _, ipv4 := pcntKey(pcnt6Key(fpFpKey6{Ovl: 7, Local: [4]uint32{1, 2, 3, 4}})); ovl != 7 || ipv4 {
		t.Errorf("pcntKey(pcnt6Key(ovl 7)) = overlay %d, ipv4 %v; want 7, false", ovl, ipv4)
	}
}
