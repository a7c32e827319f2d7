package fastpath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Fuzzing the flannel-layout programs (prg_fastpath_tx, prg_fastpath_rx and their learners)
// against a Go model of their decisions, over flow and pod tables filled so that hits, misses
// and every fallback happen among the generated frames: a frame whose flow is cached, learned
// both ways, fresh, and passes every check is encapsulated (tx) or decapsulated and handed to
// the pod (rx) exactly as the model builds it; every other frame returns TCX_NEXT unchanged.
// The learners always return TCX_NEXT unchanged and learn exactly the flows the model says,
// with the model's values. The suite runs a slice; `make fuzz` a million frames per program.

const (
	fzNetns   = 4026531840
	fzMTU     = 1500
	fzVNI     = 1
	fzPort    = 8472
	fzOtherIf = 9 // an ifindex no pod or flow should ever be delivered to
)

var (
	fzLocal  = []netip.Addr{podA, frames.Addr("198.19.1.3"), frames.Addr("198.19.1.4"), frames.Addr("198.19.1.5"), frames.Addr("198.19.1.6")}
	fzRemote = []netip.Addr{podB, frames.Addr("198.19.2.3")}
	fzVtepX  = frames.Addr("198.18.0.9") // a VTEP no flow was learned from
	fzLoMAC  = net.HardwareAddr{0, 0, 0, 0, 0, 0}
)

// Pod states: delivered to, gone (tombstone), stale (no devmap slot), stale (slot holds
// another ifindex than recorded).
const (
	podLive = iota
	podGone
	podNoSlot
	podMoved
)

type fzPod struct {
	v     fpPrgPod
	state int
}

type fzEnv struct {
	t     *testing.T
	o     *fpObjects
	cfg   fpFpCfg
	flows map[fpFpKey]fpFpFlow
	stale map[fpFpKey]bool // learned longer ago than FP_REVALIDATE_NS
	keys  []fpFpKey
	pods  map[uint32]fzPod
	rng   *rand.Rand
}

func word(a netip.Addr) uint32 { return binary.LittleEndian.Uint32(a.AsSlice()) }

func podMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xcc, 0, 0, 0, byte(i)} }

// newFzEnv loads the objects, configures a routed flannel overlay on "lo" and fills the pod
// table (pods 0 and 4 live, 1 gone, 2 without a devmap slot, 3 moved to another veth) and the flow table: every local
// pod with every remote one over TCP, UDP and ICMP echo, each flow with its own template and
// MACs, most learned both ways and consistent, some learned one way, on another veth, from
// another VTEP, with another MAC or veth than the pod's, or stale. learner: the flows also
// carry the TTLs the fast path saw on handover (what the learners look for).
func newFzEnv(t *testing.T, learner bool) *fzEnv { return newFzEnvLayout(t, learner, false) }

// newFzEnvLayout is newFzEnv for the flannel layout or (docker) the docker one: the VXLAN device
// on "lo", the flows' templates the bridge's Ethernet header.
func newFzEnvLayout(t *testing.T, learner, docker bool) *fzEnv {
	t.Helper()
	o := testutil.LoadObjects(t, loadObjects)
	ov := &overlay{Layout: LayoutRouted, VNI: fzVNI, Port: fzPort, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: fzMTU,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: macVxA, Inode: fzNetns, Routed: true}}
	cfg := ov.cfg()
	if docker {
		cfg.Flags |= cDocker
		cfg.VxIfindex = 1
	}
	e := &fzEnv{t: t, o: o, cfg: cfg, flows: map[fpFpKey]fpFpFlow{}, stale: map[fpFpKey]bool{}, pods: map[uint32]fzPod{},
		rng: rand.New(rand.NewPCG(7, 11))}
	if err := o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	for i, a := range fzLocal {
		p := fzPod{v: fpPrgPod{Slot: uint32(100 + i), Ifindex: 1}, state: []int{podLive, podGone, podNoSlot, podMoved, podLive}[i]}
		copy(p.v.CtrMac[:], podMAC(i))
		copy(p.v.BrMac[:], macBridge)
		if p.state == podGone {
			p.v.Flags = 1
		}
		if p.state != podNoSlot {
			ifx := uint32(1)
			if err := o.PrgFastpathPort.Put(p.v.Slot, fpBpfDevmapVal{Ifindex: ifx}); err != nil {
				t.Fatal(err)
			}
		}
		if p.state == podMoved {
			p.v.Ifindex = fzOtherIf
		}
		if err := o.PrgFastpathEp.Put(fpPrgPodKey{Netns: fzNetns, Family: 4, Addr: [4]uint32{word(a)}}, p.v); err != nil {
			t.Fatal(err)
		}
		e.pods[word(a)] = p
	}
	rng := rand.New(rand.NewPCG(3, 5))
	idx := 0
	for li, l := range fzLocal {
		for _, r := range fzRemote {
			for _, c := range []struct {
				proto        uint8
				lport, rport uint16
			}{{6, 40000, 5201}, {17, 53000, 53}, {1, 77, 77}} {
				idx++
				k := keyOf(l, r, c.lport, c.rport, c.proto)
				f := fpFpFlow{Vtep: word(vtepB), OutIfindex: 1, InIfindex: e.pods[word(l)].v.Ifindex, Flags: fOut | fIn,
					OutTtlDec: uint8(rng.IntN(3)), InTtlDec: uint8(rng.IntN(3))}
				copy(f.Tmpl[:], template())
				f.Tmpl[11] = byte(idx)                                     // outer source MAC: which flow's template
				binary.BigEndian.PutUint16(f.Tmpl[34:], uint16(33000+idx)) // outer UDP source port
				f.Tmpl[15] = byte(rng.IntN(64)) << 2                       // outer DSCP
				binary.BigEndian.PutUint16(f.Tmpl[24:], 0)                 // outer IPv4 checksum: the program's
				copy(f.InMac[:6], podMAC(li))
				copy(f.InMac[6:], net.HardwareAddr{0x02, 0xbb, 0, 0, 0, byte(idx)}) // which flow's MACs
				switch rng.IntN(14) {
				case 0:
					f.Flags = fOut
				case 1:
					f.Flags = fIn
				case 2:
					f.Flags = 0
				case 3:
					f.OutIfindex = fzOtherIf
				case 4:
					f.Vtep = word(fzVtepX)
				case 5:
					f.InMac[0] ^= 0x10
				case 6:
					f.InIfindex = fzOtherIf
				case 7:
					e.stale[k] = true
				}
				if docker { // the Ethernet header the bridge sent the flow to the VXLAN device with
					copy(f.Tmpl[0:], macBridge)
					copy(f.Tmpl[6:], macPod)
					if rng.IntN(10) == 0 {
						f.Tmpl[11] ^= 0x40
					}
				}
				if learner {
					seen := []uint8{0, 1, 2, 63, 64, 65, 255}
					f.OutTtlSeen, f.InTtlSeen = seen[rng.IntN(len(seen))], seen[rng.IntN(len(seen))]
				}
				e.flows[k] = f
				e.keys = append(e.keys, k)
			}
		}
	}
	e.install()
	return e
}

// install (re)writes the flow table as the model holds it: the learned flows with fresh or
// stale timestamps, and nothing else (the handovers of missed frames add entries; the table
// is an LRU that could otherwise evict a learned flow).
func (e *fzEnv) install() {
	e.t.Helper()
	var k fpFpKey
	var v fpFpFlow
	var extra []fpFpKey
	it := e.o.PrgFastpathFlow.Iterate()
	for it.Next(&k, &v) {
		if _, ok := e.flows[k]; !ok {
			extra = append(extra, k)
		}
	}
	for _, k := range extra {
		_ = e.o.PrgFastpathFlow.Delete(k)
	}
	now := monoNs()
	for _, k := range e.keys {
		f := e.flows[k]
		f.OutNs, f.InNs = now, now
		if e.stale[k] {
			f.OutNs, f.InNs = now-uint64(10*time.Second), now-uint64(10*time.Second)
		}
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			e.t.Fatal(err)
		}
	}
}

// fzPkt is struct fp_pkt as the model reads it.
type fzPkt struct {
	dst, src     []byte
	l3           int
	saddr, daddr uint32
	sport, dport uint16 // as in memory (network order read as little-endian)
	proto, ttl   uint8
	tos, hdrs    uint8
}

const fzParsed = 0

// fzParse is parse_at: 0 and the inner packet, or a non-zero reason it takes the normal path.
func fzParse(b []byte, off int) (fzPkt, int) {
	var p fzPkt
	h, r := flow.ParseFrame(b, off, 0)
	if r != flow.OK || h.Family != 4 {
		return p, 1
	}
	p.dst, p.src, p.l3 = b[off:off+6], b[off+6:off+12], h.L3
	if p.dst[0]&1 != 0 || b[h.L3]&0xf != 5 || h.Frag {
		return p, 2
	}
	p.saddr, p.daddr, p.proto, p.ttl, p.tos = h.Key.Src[0], h.Key.Dst[0], h.Key.Proto, h.TTL, b[h.L3+1]
	p.sport, p.dport = h.Key.WirePorts()
	switch p.proto {
	case 6:
		t := fzAt(b, h.L4, 14)
		if t == nil || t[13]&7 != 0 {
			return p, 3
		}
		p.hdrs = 20 + (t[12]>>4)*4
	case 17:
		p.hdrs = 28
	case 1:
		c := fzAt(b, h.L4, 6)
		if c == nil || (c[0] != 0 && c[0] != 8) || c[1] != 0 {
			return p, 3
		}
		p.sport = binary.LittleEndian.Uint16(c[4:])
		p.dport, p.hdrs = p.sport, 28
	default:
		return p, 3
	}
	return p, fzParsed
}

func fzAt(b []byte, off, n int) []byte {
	if off > flow.MaxOff || off+n > len(b) {
		return nil
	}
	return b[off : off+n]
}

func (p fzPkt) keyOut() fpFpKey {
	return fpFpKey{Local: p.saddr, Remote: p.daddr, Lport: p.sport, Rport: p.dport, Proto: p.proto}
}

func (p fzPkt) keyIn() fpFpKey {
	return fpFpKey{Local: p.daddr, Remote: p.saddr, Lport: p.dport, Rport: p.sport, Proto: p.proto}
}

// fzOuter is outer_at: whether the frame is VXLAN of our overlay (port, VNI, flags exactly I),
// and the outer addresses where the outer IPv4 header parsed.
func fzOuter(b []byte) (vxlan bool, saddr, daddr uint32) {
	h, r := flow.ParseFrame(b, 0, 0)
	if r != flow.OK || h.Family != 4 {
		return false, 0, 0
	}
	saddr, daddr = h.Key.Src[0], h.Key.Dst[0]
	if h.Key.Proto == 17 && (h.L4-h.L3 != 20 || h.Frag) {
		return false, saddr, daddr
	}
	inner, vni, r := flow.VXLANOf(b, h, []uint16{fzPort})
	if r != flow.OK {
		return false, saddr, daddr
	}
	hdr := b[inner-8 : inner]
	return binary.BigEndian.Uint32(hdr) == 0x08000000 && vni == fzVNI && hdr[7] == 0, saddr, daddr
}

func (e *fzEnv) learned(k fpFpKey, need uint32) (fpFpFlow, bool) {
	f, ok := e.flows[k]
	return f, ok && f.Flags&need == need && !e.stale[k]
}

// modelTx: whether prg_fastpath_tx encapsulates b, and the frame it must make of it.
func (e *fzEnv) modelTx(b []byte, gso uint32) (bool, []byte) {
	p, r := fzParse(b, 0)
	if r != fzParsed {
		return false, nil
	}
	f, ok := e.learned(p.keyOut(), fOut|fIn)
	if !ok || f.OutIfindex != 1 || p.ttl <= f.OutTtlDec {
		return false, nil
	}
	wire := uint32(len(b)) - 14 + 50
	if gso > 0 {
		wire = gso + uint32(p.hdrs) + 50
	}
	if wire > fzMTU {
		return false, nil
	}
	out := append(append([]byte{}, f.Tmpl[:]...), b[14:]...)
	olen := len(b) + 50 - 14
	binary.BigEndian.PutUint16(out[16:], uint16(olen))
	ecn := p.tos & 3
	if ecn == 3 {
		ecn = 2
	}
	out[15] = out[15]&^3 | ecn
	binary.BigEndian.PutUint16(out[38:], uint16(olen-20))
	binary.BigEndian.PutUint16(out[40:], 0)
	ttlSub(out[64:], f.OutTtlDec)
	return true, out
}

// ttlSub is ttl_sub_ip: TTL lowered, the checksum updated incrementally (RFC 1624).
func ttlSub(ip []byte, dec uint8) {
	if dec == 0 {
		return
	}
	old := uint32(binary.BigEndian.Uint16(ip[8:]))
	ip[8] -= dec
	c := uint32(^binary.BigEndian.Uint16(ip[10:])) + (^old & 0xffff) + uint32(binary.BigEndian.Uint16(ip[8:]))
	c = c&0xffff + c>>16
	c = c&0xffff + c>>16
	binary.BigEndian.PutUint16(ip[10:], ^uint16(c))
}

// modelRx: whether prg_fastpath_rx hands b to a pod, and the frame the pod gets.
func (e *fzEnv) modelRx(b []byte) (bool, []byte) {
	vx, saddr, daddr := fzOuter(b)
	if !vx || daddr != word(vtepA) || !bytes.Equal(b[:6], fzLoMAC) { // PACKET_HOST on lo
		return false, nil
	}
	p, r := fzParse(b, 50)
	if r != fzParsed || !bytes.Equal(p.dst, macVxA) {
		return false, nil
	}
	f, ok := e.learned(p.keyIn(), fOut|fIn)
	if !ok || f.Vtep != saddr {
		return false, nil
	}
	pod, ok := e.pods[p.daddr]
	if !ok || pod.state != podLive || pod.v.Ifindex != f.InIfindex || !bytes.Equal(pod.v.CtrMac[:], f.InMac[:6]) ||
		p.ttl <= f.InTtlDec {
		return false, nil
	}
	out := append(append([]byte{}, f.InMac[:]...), b[62:]...)
	ttlSub(out[14:], f.InTtlDec)
	return true, out
}

// fzGen makes frames for the fast path: pod traffic of the cached flows and others (tx), the
// same inside VXLAN of our overlay or nearly (rx, learners), random frames, and any of them
// damaged once.
type fzGen struct{ rng *rand.Rand }

func (g fzGen) pick(s []netip.Addr) netip.Addr { return s[g.rng.IntN(len(s))] }

// inner is an IPv4 TCP/UDP/ICMP echo frame from src to dst; ports of a cached flow mostly.
func (g fzGen) inner(dmac net.HardwareAddr, src, dst netip.Addr, outbound bool) []byte {
	rng := g.rng
	flows := []struct {
		proto        uint8
		lport, rport uint16
	}{{6, 40000, 5201}, {17, 53000, 53}, {1, 77, 77}, {6, 40001, 5201}, {47, 0, 0}}
	c := flows[rng.IntN(len(flows))]
	sport, dport := c.lport, c.rport
	if !outbound {
		sport, dport = dport, sport
	}
	n := rng.IntN(120)
	if rng.IntN(8) == 0 {
		n = 1380 + rng.IntN(160) // around the MTU
	}
	var l4 []byte
	switch c.proto {
	case 6:
		l4 = frames.TCP(sport, dport, make([]byte, n))
		l4[13] = 0x10
		if rng.IntN(6) == 0 {
			l4[13] = byte(rng.Uint32())
		}
	case 17:
		l4 = frames.UDP(sport, dport, make([]byte, n))
	case 1:
		l4 = append([]byte{8, 0, 0, 0, 0, 77, 0, 1}, make([]byte, n)...)
		if !outbound {
			l4[0] = 0
		}
		if rng.IntN(6) == 0 {
			l4[0], l4[1] = byte(rng.IntN(16)), byte(rng.IntN(2))
		}
	default:
		l4 = make([]byte, 8+n)
	}
	ttls := []uint8{1, 2, 3, 64, 255}
	h := frames.IPv4{Src: src, Dst: dst, Proto: c.proto, TTL: ttls[rng.IntN(len(ttls))], TOS: byte(rng.Uint32()), ID: uint16(rng.Uint32())}
	if rng.IntN(20) == 0 {
		h.FragOff = 0x2000
	}
	return frames.EthMAC(dmac, macPod, 0x0800, h.Wrap(l4))
}

// tx is a frame a local pod sends.
func (g fzGen) tx() []byte {
	rng := g.rng
	if rng.IntN(8) == 0 {
		return frames.Random(rng, []uint16{fzPort})
	}
	dmac := macBridge
	if rng.IntN(20) == 0 {
		dmac = net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}
	}
	src, dst := g.pick(fzLocal), g.pick(fzRemote)
	if rng.IntN(10) == 0 {
		src, dst = dst, src
	}
	f := g.inner(dmac, src, dst, true)
	if rng.IntN(20) == 0 {
		f = frames.IPv4Options(f, 14, []byte{1, 1, 1, 0})
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+20+20)
	}
	return f
}

// encap is a frame on the underlay from src VTEP to dst VTEP carrying a pod frame from a remote
// pod to a local one (in) or the other way (out).
func (g fzGen) encap(srcVTEP, dstVTEP netip.Addr, in bool) []byte {
	rng := g.rng
	if rng.IntN(10) == 0 {
		return frames.Random(rng, []uint16{fzPort})
	}
	src, dst := g.pick(fzRemote), g.pick(fzLocal)
	if !in {
		src, dst = dst, src
	}
	dmac := macVxA
	if rng.IntN(15) == 0 {
		dmac = macPod
	}
	if !in {
		dmac = macVxB
	}
	vni, port := uint32(fzVNI), uint16(fzPort)
	if rng.IntN(15) == 0 {
		vni = uint32(rng.IntN(3))
	}
	if rng.IntN(15) == 0 {
		port = 4789
	}
	if rng.IntN(15) == 0 {
		srcVTEP = fzVtepX
	}
	omac := fzLoMAC
	if rng.IntN(15) == 0 {
		omac = macNicA
	}
	h := frames.IPv4{Src: srcVTEP, Dst: dstVTEP, Proto: 17, ID: uint16(rng.Uint32())}
	if rng.IntN(30) == 0 {
		h.FragOff = 0x2000
	}
	vx := frames.VXLAN(vni, g.inner(dmac, src, dst, !in))
	if rng.IntN(20) == 0 {
		vx[rng.IntN(8)] |= byte(1 << rng.IntN(8)) // other VXLAN flags, reserved bits
	}
	f := frames.EthMAC(omac, macNicB, 0x0800, h.Wrap(frames.UDP(uint16(32768+rng.IntN(20000)), port, vx)))
	if rng.IntN(20) == 0 { // outer or inner IPv4 options
		f = frames.IPv4Options(f, []int{14, 64}[rng.IntN(2)], []byte{1, 1, 1, 0})
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 50+14+20+20)
	}
	return f
}

// fzRun runs p on pkt; gso > 0 passes GSO metadata (gso_size, gso_segs) in the context, mark
// a skb mark. It returns the verdict, the frame after the program and the mark after it.
func (e *fzEnv) fzRun(p *ebpf.Program, pkt []byte, gso, mark uint32) (uint32, []byte, uint32) {
	out := make([]byte, len(pkt)+128)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ctx := make([]byte, 192) // struct __sk_buff: mark at 8, wire_len 160, gso_segs 164, gso_size 176
	binary.LittleEndian.PutUint32(ctx[8:], mark)
	if gso > 0 {
		binary.LittleEndian.PutUint32(ctx[160:], uint32(len(pkt)))
		binary.LittleEndian.PutUint32(ctx[164:], 2)
		binary.LittleEndian.PutUint32(ctx[176:], gso)
	}
	ctxOut := make([]byte, 192)
	opts.Context, opts.ContextOut = ctx, ctxOut
	ret, err := p.Run(opts)
	if err != nil {
		e.t.Fatalf("test run: %v (gso %d, % x)", err, gso, pkt)
	}
	return ret, opts.DataOut, binary.LittleEndian.Uint32(ctxOut[8:])
}

// fzEach runs n frames from gen through check, every 4096th frame also truncated at every
// offset, and reinstalls the tables every 2048 runs (timestamps fresh, handover entries gone).
func (e *fzEnv) fzEach(n int, gen func() []byte, check func([]byte)) int {
	runs := 0
	return frames.Each(e.t.Failed, n, 4096, gen, func(b []byte) {
		if runs%2048 == 0 {
			e.install()
		}
		runs++
		check(b)
	})
}

func TestFuzzTx(t *testing.T) {
	e := newFzEnv(t, false)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), g.tx, func(b []byte) {
		var gso uint32
		if e.rng.IntN(8) == 0 {
			gso = uint32(64 + e.rng.IntN(1500))
		}
		in := append([]byte{}, b...)
		hit, want := e.modelTx(in, gso)
		var before Direction
		if hit && gso > 0 {
			before, _ = e.counters(t)
		}
		ret, out, _ := e.fzRun(e.o.PrgFastpathTx, b, gso, 0)
		if hit && gso > 0 {
			// A test run cannot set the skb's gso_type, and bpf_skb_adjust_room refuses to grow
			// a GSO skb of no type: the program counts an error and leaves the frame alone.
			// (The MTU check that reads gso_size ran before it: a frame too big per segment is
			// a normal-path frame of the model.)
			after, _ := e.counters(t)
			if ret != tcxNext || !bytes.Equal(out, in) || after["error"] != before["error"]+1 {
				t.Errorf("GSO frame past the MTU check: verdict %d, changed %v, errors %d -> %d", int32(ret), !bytes.Equal(out, in), before["error"], after["error"])
			}
			return
		}
		if !hit {
			if ret != tcxNext || !bytes.Equal(out, in) {
				p, _ := fzParse(in, 0)
				t.Errorf("model: normal path; program: verdict %d, changed %v (gso %d); flow %+v stale %v\n in % x\nout % x", int32(ret), !bytes.Equal(out, in), gso,
					e.flows[p.keyOut()], e.stale[p.keyOut()], in, out)
			}
			return
		}
		hits++
		if ret != tcActRedirect {
			t.Errorf("model: encapsulated; program: verdict %d (gso %d): % x", int32(ret), gso, in)
			return
		}
		if err := sameEncap(out, want); err != nil {
			t.Errorf("%v (gso %d)\n in % x\nout % x\nwant % x", err, gso, in, out, want)
		}
	})
	t.Logf("%d frames, %d encapsulated", runs, hits)
	if hits == 0 || hits == runs {
		t.Fatalf("%d of %d frames encapsulated: the generator misses a path", hits, runs)
	}
}

// sameEncap compares an encapsulated frame with the model's, but for the outer IP ID (random)
// and the outer IP checksum (checked valid instead).
func sameEncap(out, want []byte) error {
	if len(out) != len(want) {
		return fmt.Errorf("%d bytes out, model %d", len(out), len(want))
	}
	got := append([]byte{}, out...)
	copy(got[18:20], want[18:20])
	copy(got[24:26], want[24:26])
	if !bytes.Equal(got, want) {
		return fmt.Errorf("frame differs from the model")
	}
	if csum(out[14:34], 0) != 0 {
		return fmt.Errorf("outer IPv4 checksum wrong")
	}
	return nil
}

func TestFuzzRx(t *testing.T) {
	e := newFzEnv(t, false)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), func() []byte { return g.encap(vtepB, vtepA, true) }, func(b []byte) {
		in := append([]byte{}, b...)
		ret, out, _ := e.fzRun(e.o.PrgFastpathRx, b, 0, 0)
		hit, want := e.modelRx(in)
		switch {
		case !hit && (ret != tcxNext || !bytes.Equal(out, in)):
			t.Errorf("model: normal path; program: verdict %d, changed %v\n in % x\nout % x", int32(ret), !bytes.Equal(out, in), in, out)
		case hit && ret != tcActRedirect:
			t.Errorf("model: to the pod; program: verdict %d: % x", int32(ret), in)
		case hit && !bytes.Equal(out, want):
			t.Errorf("delivered frame differs from the model\n in % x\nout % x\nwant % x", in, out, want)
		}
		if hit {
			hits++
		}
	})
	t.Logf("%d frames, %d delivered", runs, hits)
	if hits == 0 || hits == runs {
		t.Fatalf("%d of %d frames delivered: the generator misses a path", hits, runs)
	}
}

// fzLearnCheck runs a learner over the generated frames: verdict TCX_NEXT, frame unchanged,
// the flow the model names learned with the model's values, every other flow untouched.
// learnable parses frame b (its inner frame at off) and finds the model's flow for its egress
// (out) or ingress key; ok when the normal path has seen the flow at a TTL no lower than the
// frame's, so the learner may complete that direction.
func (e *fzEnv) learnable(b []byte, off int, out bool) (p fzPkt, k fpFpKey, f fpFpFlow, ok bool) {
	p, r := fzParse(b, off)
	if r != fzParsed {
		return p, fpFpKey{}, fpFpFlow{}, false
	}
	seen := func(f fpFpFlow) uint8 { return f.InTtlSeen }
	if k = p.keyIn(); out {
		k, seen = p.keyOut(), func(f fpFpFlow) uint8 { return f.OutTtlSeen }
	}
	f, ok = e.flows[k]
	return p, k, f, ok && seen(f) != 0 && seen(f) >= p.ttl
}

func fzLearnCheck(t *testing.T, e *fzEnv, p *ebpf.Program, marks bool, gen func() []byte, model func([]byte) (fpFpKey, fpFpFlow, bool)) {
	learnt := 0
	var k fpFpKey
	runs := e.fzEach(frames.FuzzCount(20000), gen, func(b []byte) {
		var mark uint32
		if marks && e.rng.IntN(20) == 0 {
			mark = markFast // a frame the fast path sent: the learner skips it and clears the mark
		}
		in := append([]byte{}, b...)
		ret, out, m := e.fzRun(p, b, 0, mark)
		if ret != tcxNext || !bytes.Equal(out, in) || m != 0 {
			t.Errorf("learner: verdict %d, changed %v, mark %#x after: % x", int32(ret), !bytes.Equal(out, in), m, in)
		}
		wk, want, learn := model(in)
		if mark != 0 {
			learn = false
		}
		if learn {
			learnt++
			var got fpFpFlow
			if err := e.o.PrgFastpathFlow.Lookup(wk, &got); err != nil {
				t.Fatal(err)
			}
			if got.OutNs == 0 && got.InNs == 0 {
				t.Errorf("learned without a timestamp: %+v", got)
			}
			want.OutNs, want.InNs = got.OutNs, got.InNs
			if got != want {
				t.Errorf("learned %+v\nmodel   %+v\nfrom % x", got, want, in)
			}
			if err := e.o.PrgFastpathFlow.Put(wk, e.flows[wk]); err != nil { // as installed
				t.Fatal(err)
			}
		}
		if e.rng.IntN(64) == 0 || !learn { // nothing else learned
			keys := e.keys
			if !learn {
				keys = []fpFpKey{e.keys[e.rng.IntN(len(e.keys))]}
				if _, ok := e.flows[wk]; ok {
					keys = append(keys, wk)
				}
			}
			for _, k = range keys {
				var got fpFpFlow
				if err := e.o.PrgFastpathFlow.Lookup(k, &got); err != nil {
					t.Fatal(err)
				}
				want := e.flows[k]
				want.OutNs, want.InNs = got.OutNs, got.InNs
				if got != want {
					t.Errorf("flow %+v changed by a frame the model does not learn from\n got %+v\nwant %+v\nframe % x", k, got, want, in)
				}
			}
		}
	})
	t.Logf("%d frames, %d learned from", runs, learnt)
	if learnt == 0 || learnt == runs {
		t.Fatalf("%d of %d frames learned from: the generator misses a path", learnt, runs)
	}
}

func TestFuzzLearnTx(t *testing.T) {
	e := newFzEnv(t, true)
	g := fzGen{e.rng}
	fzLearnCheck(t, e, e.o.PrgFastpathLrnTx, true, func() []byte { return g.encap(vtepA, vtepB, false) }, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		vx, saddr, daddr := fzOuter(b)
		if !vx || saddr != word(vtepA) {
			return fpFpKey{}, fpFpFlow{}, false
		}
		p, k, f, ok := e.learnable(b, 50, true)
		if !ok {
			return k, f, false
		}
		copy(f.Tmpl[:], b[:64])
		f.Vtep, f.OutTtlDec, f.OutTtlSeen, f.Flags = daddr, f.OutTtlSeen-p.ttl, 0, f.Flags|fOut
		return k, f, true
	})
}

func TestFuzzLearnRx(t *testing.T) {
	e := newFzEnv(t, true)
	g := fzGen{e.rng}
	gen := func() []byte {
		if e.rng.IntN(8) == 0 {
			return frames.Random(e.rng, []uint16{fzPort})
		}
		dmac := podMAC(e.rng.IntN(len(fzLocal)))
		f := g.inner(dmac, g.pick(fzRemote), g.pick(fzLocal), false)
		if e.rng.IntN(3) == 0 {
			f = frames.Mutate(e.rng, f, 14+20+20)
		}
		return f
	}
	fzLearnCheck(t, e, e.o.PrgFastpathLrnRx, false, gen, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		p, k, f, ok := e.learnable(b, 0, false)
		if !ok {
			return k, f, false
		}
		copy(f.InMac[:], b[:12])
		f.InIfindex, f.InTtlDec, f.InTtlSeen, f.Flags = 1, f.InTtlSeen-p.ttl, 0, f.Flags|fIn
		return k, f, true
	})
}

func (e *fzEnv) counters(t *testing.T) (Direction, Direction) {
	return (&progEnv{o: e.o}).counters(t)
}

// Docker layout: prg_fastpath_dtx redirects a cached flow to the VXLAN device unchanged (marked
// for its learner), prg_fastpath_drx hands an inner frame straight to the pod, and
// prg_fastpath_dlrn_tx learns the bridge's Ethernet header; every other frame goes on unchanged.

func TestFuzzDockerTx(t *testing.T) {
	e := newFzEnvLayout(t, false, true)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), g.tx, func(b []byte) {
		in := append([]byte{}, b...)
		hit := false
		if p, r := fzParse(in, 0); r == fzParsed {
			f, ok := e.learned(p.keyOut(), fOut|fIn)
			hit = ok && f.OutIfindex == 1 && bytes.Equal(in[:12], f.Tmpl[:12]) && f.OutTtlDec == 0
		}
		ret, out, mark := e.fzRun(e.o.PrgFastpathDtx, b, 0, 0)
		want, wmark := tcxNext, uint32(0)
		if hit {
			want, wmark = tcActRedirect, markFast
			hits++
		}
		if ret != uint32(want) || mark != wmark || !bytes.Equal(out, in) {
			t.Errorf("dtx: verdict %d mark %#x, model %d %#x; frame changed %v: % x", int32(ret), mark, int32(want), wmark, !bytes.Equal(out, in), in)
		}
	})
	t.Logf("%d frames, %d redirected", runs, hits)
	if hits == 0 || hits == runs {
		t.Fatalf("%d of %d frames redirected: the generator misses a path", hits, runs)
	}
}

func TestFuzzDockerRx(t *testing.T) {
	e := newFzEnvLayout(t, false, true)
	g := fzGen{e.rng}
	gen := func() []byte {
		if e.rng.IntN(8) == 0 {
			return frames.Random(e.rng, []uint16{fzPort})
		}
		li := e.rng.IntN(len(fzLocal))
		f := g.inner(podMAC(li), g.pick(fzRemote), fzLocal[e.rng.IntN(len(fzLocal))], false)
		if e.rng.IntN(3) == 0 {
			f = frames.Mutate(e.rng, f, 14+20+20)
		}
		return f
	}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), gen, func(b []byte) {
		in := append([]byte{}, b...)
		want := []byte(nil)
		if p, r := fzParse(in, 0); r == fzParsed {
			f, ok := e.learned(p.keyIn(), fOut|fIn)
			pod, live := e.pods[p.daddr]
			if ok && live && pod.state == podLive && pod.v.Ifindex == f.InIfindex && bytes.Equal(pod.v.CtrMac[:], f.InMac[:6]) &&
				bytes.Equal(in[:6], f.InMac[:6]) && f.InTtlDec == 0 {
				want = append(append([]byte{}, f.InMac[:]...), in[12:]...)
			}
		}
		ret, out, _ := e.fzRun(e.o.PrgFastpathDrx, b, 0, 0)
		switch {
		case want == nil && (ret != tcxNext || !bytes.Equal(out, in)):
			t.Errorf("drx: model: normal path; program: verdict %d, changed %v: % x", int32(ret), !bytes.Equal(out, in), in)
		case want != nil && (ret != tcActRedirect || !bytes.Equal(out, want)):
			t.Errorf("drx: model: to the pod; program: verdict %d\n in % x\nout % x\nwant % x", int32(ret), in, out, want)
		}
		if want != nil {
			hits++
		}
	})
	t.Logf("%d frames, %d delivered", runs, hits)
	if hits == 0 || hits == runs {
		t.Fatalf("%d of %d frames delivered: the generator misses a path", hits, runs)
	}
}

func TestFuzzDockerLearnTx(t *testing.T) {
	e := newFzEnvLayout(t, true, true)
	g := fzGen{e.rng}
	fzLearnCheck(t, e, e.o.PrgFastpathDlrnTx, true, g.tx, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		p, k, f, ok := e.learnable(b, 0, true)
		if !ok {
			return k, f, false
		}
		copy(f.Tmpl[:14], b[:14])
		f.OutTtlDec, f.OutTtlSeen, f.Flags = f.OutTtlSeen-p.ttl, 0, f.Flags|fOut
		return k, f, true
	})
}
