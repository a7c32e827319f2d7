package fastpath

import (
	"bytes"
	"net"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// Several overlays on one node: each copy of the programs (fp_ovl) reads its own config, counts
// into its own counters and keys its flows apart, over shared maps. Two overlays here carry the
// same pod addresses (Docker lets overlays reuse subnets): a flow learned on one must not take
// the fast path on the other.
func TestOverlaysApart(t *testing.T) {
	e := newProgEnv(t) // overlay 0: routed, VNI 1, on "lo"
	p1, err := loadOverlayPrograms(&e.o.fpMaps, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	k0 := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k0, 1)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	pkt := podFrame().bytes()
	counts := func(ovl int) (Direction, Direction) {
		t.Helper()
		out, in, err := (&pinned{fpMaps: e.o.fpMaps}).counters(ovl)
		if err != nil {
			t.Fatal(err)
		}
		return out, in
	}

	// Overlay 1 not configured: its copy leaves everything alone and counts nothing.
	if ret, out := e.run(t, p1.PrgFastpathTx, pkt, 0); ret != tcxNext || !bytes.Equal(out, pkt) {
		t.Fatalf("unconfigured overlay 1: verdict %d, changed %v", int32(ret), !bytes.Equal(out, pkt))
	}
	if o1, _ := counts(1); o1["miss"]+o1["hit"] != 0 {
		t.Fatalf("unconfigured overlay 1 counted: %v", o1)
	}

	// Configured (VNI 4097): overlay 0's learned flow is not overlay 1's: a miss, counted there,
	// and the handover creates overlay 1's own entry.
	ov1 := &overlay{Index: 1, Layout: LayoutRouted, VNI: 4097, Port: 4789, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: 1500,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: macVxA, Inode: 4026531840, Routed: true}}
	if err := e.o.PrgFastpathCfg.Put(uint32(1), ov1.cfg()); err != nil {
		t.Fatal(err)
	}
	o0before, _ := counts(0)
	if ret, out := e.run(t, p1.PrgFastpathTx, pkt, 0); ret != tcxNext || !bytes.Equal(out, pkt) {
		t.Fatalf("overlay 1 took overlay 0's flow: verdict %d", int32(ret))
	}
	o1, _ := counts(1)
	o0, _ := counts(0)
	if o1["miss"] != 1 || o0["miss"] != o0before["miss"] || o0["hit"] != o0before["hit"] {
		t.Fatalf("counters: overlay 1 %v, overlay 0 %v -> %v", o1, o0before, o0)
	}
	k1 := k0
	k1.Ovl = 1
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(k1, &f); err != nil || f.Flags&^fCounted != 0 {
		t.Fatalf("overlay 1's handover entry: %v %+v", err, f)
	}

	// Learned on overlay 1 too: each copy hits its own flow, counted apart.
	e.learn(t, k1, 1)
	if ret, _ := e.run(t, p1.PrgFastpathTx, pkt, 0); ret != tcActRedirect {
		t.Fatalf("overlay 1: verdict %d, want redirect", int32(ret))
	}
	if ret, _ := e.run(t, e.o.PrgFastpathTx, pkt, 0); ret != tcActRedirect {
		t.Fatalf("overlay 0: verdict %d, want redirect", int32(ret))
	}
	o1, _ = counts(1)
	o0, _ = counts(0)
	if o1["hit"] != 1 || o0["hit"] != o0before["hit"]+1 {
		t.Fatalf("hits: overlay 1 %d, overlay 0 %d (before %d)", o1["hit"], o0["hit"], o0before["hit"])
	}

	// A frame of overlay 0's VNI is not overlay 1's: its receive copy leaves it alone, counted
	// "other" there.
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	inner := frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10, payload: make([]byte, 100)}
	vx := frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, inner.bytes()...)}
	b := vx.bytes()
	_, in1before := counts(1)
	if ret, out := e.run(t, p1.PrgFastpathRx, b, 0); ret != tcxNext || !bytes.Equal(out, b) {
		t.Fatalf("overlay 1 took a VNI 1 frame: verdict %d", int32(ret))
	}
	if _, in1 := counts(1); in1["other"] != in1before["other"]+1 {
		t.Fatalf("overlay 1 ingress: %v", in1)
	}
}

// TestLocalServiceReplyOnSecondOverlay: a same-node Service backend's due reply on overlay 1
// finds its client's flow under overlay 1's key (local_reply_due keys it with fp_ovl): the
// client not re-learned since, the reply stays on the fast path. Keyed as overlay 0's, the
// lookup missed and every due reply went to the normal path.
func TestLocalServiceReplyOnSecondOverlay(t *testing.T) {
	e := newProgEnv(t)
	p1, err := loadOverlayPrograms(&e.o.fpMaps, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	ov1 := &overlay{Index: 1, Layout: LayoutRouted, VNI: 4097, Port: 4789, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: 1500,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: macVxA, Inode: 4026531840, Routed: true}}
	if err := e.o.PrgFastpathCfg.Put(uint32(1), ov1.cfg()); err != nil {
		t.Fatal(err)
	}
	cl, be := e.localSvc(t)
	now := monoNs()
	cl.OutNs, be.OutNs, be.InNs = now-7e9, now-6e9, now-6e9 // the reply due, its client learned before it
	ck, bk := keyOf(podA, svcAddr, 40000, 80, 6), keyOf(podA2, podA, 5201, 40000, 6)
	ck.Ovl, bk.Ovl = 1, 1
	for k, f := range map[fpFpKey]fpFpFlow{ck: cl, bk: be} {
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	rep := frame{dst: macPod, src: macPo2, saddr: podA2, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10,
		payload: []byte("reply from the backend")}
	if ret, _ := e.run(t, p1.PrgFastpathTx, rep.bytes(), 0); ret != tcActRedirect {
		out, _, _ := (&pinned{fpMaps: e.o.fpMaps}).counters(1)
		t.Fatalf("overlay 1's due reply: verdict %d, want redirect (counters %v)", int32(ret), out)
	}
}
