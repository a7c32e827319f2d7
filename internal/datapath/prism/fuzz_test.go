package prism

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Fuzzing prg_prism_vx and prg_prism_nic against a Go model: the rules as the user wrote them
// (Rule, matched here field by field, not through the program's encoding) over the parser model
// (flow.ParseFrame), the endpoint table, and the isolation plan's steering model (isoConfig.steer).
// prg_prism_vx: a frame no rule matches, or whose endpoint is missing, or whose MAC or TTL the
// normal path would treat otherwise, returns TCX_NEXT unchanged; an HP frame to a vanished or
// stale endpoint is dropped unchanged; an HP frame to a live endpoint is redirected, unchanged
// (bridged) or rewritten exactly as IP forwarding out of the bridge would (routed).
// prg_prism_nic: every frame goes on unchanged; VXLAN frames are steered with the model's class,
// flow hash, RPS index and hash; nothing else is steered.

const fzRules = `
	proto=tcp dport=11111
	proto=udp sport=5000-5999
	dscp=ef
	src=198.19.3.0/24
	proto=tcp dport=7000 family=ipv6
	proto=udp dst=198.19.2.2
	proto=sctp dst=fd00:19:2::/64 sport=1-100`

var (
	fzGone   = []string{"198.19.2.3", "fd00:19:2::3"} // tombstones
	fzStale  = []string{"198.19.2.4", "fd00:19:2::4"} // the devmap slot holds another device
	fzDsts   = []string{ctrIP, ctrIP6, fzGone[0], fzGone[1], fzStale[0], fzStale[1], "198.19.2.9", "fd00:19:2::9"}
	fzSrcs   = []string{peerIP, peerIP6, "198.19.3.7", "fd00:19:1::7"}
	fzOther  = net.HardwareAddr{0x02, 0x42, 198, 19, 9, 9}
	fzPorts  = []uint16{11111, 5000, 5999, 6000, 7000, 80, 53, 1, 100, 101}
	fzEpKind = map[netip.Addr]int{} // 0 live, 1 gone, 2 stale; absent: no endpoint
)

func init() {
	for _, a := range []string{ctrIP, ctrIP6} {
		fzEpKind[netip.MustParseAddr(a)] = 0
	}
	for _, a := range fzGone {
		fzEpKind[netip.MustParseAddr(a)] = 1
	}
	for _, a := range fzStale {
		fzEpKind[netip.MustParseAddr(a)] = 2
	}
}

func newFzEnv(t *testing.T, routed bool) (*progEnv, []Rule) {
	e := newProgEnv(t, routed, fzRules)
	for i, a := range fzGone {
		e.endpoint(a, uint32(20+i), loIfindex, 1)
	}
	for i, a := range fzStale {
		e.endpoint(a, uint32(30+i), 5, 0) // the entry says ifindex 5, the slot holds lo
	}
	rs, err := ParseRules(fzRules)
	if err != nil {
		t.Fatal(err)
	}
	return e, rs
}

// fzMatch is a rule's meaning: every criterion given holds for the parsed inner headers.
func fzMatch(r Rule, h flow.Hdrs) bool {
	if r.All {
		return true
	}
	if r.Family != 0 && r.Family != int(h.Family) || r.Proto >= 0 && r.Proto != int(h.Key.Proto) || r.DSCP >= 0 && r.DSCP != int(h.DSCP) {
		return false
	}
	if !r.SPort.any() || !r.DPort.any() {
		if !h.HasPorts {
			return false
		}
		in := func(p PortRange, v uint16) bool { return p.any() || p.Lo <= v && v <= p.Hi }
		if !in(r.SPort, h.Key.Sport) || !in(r.DPort, h.Key.Dport) {
			return false
		}
	}
	src, dst := fzAddr(h.Family, h.Key.Src), fzAddr(h.Family, h.Key.Dst)
	return (!r.Src.IsValid() || r.Src.Contains(src)) && (!r.Dst.IsValid() || r.Dst.Contains(dst))
}

func fzAddr(family uint8, w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.LittleEndian.PutUint32(b[4*i:], w[i])
	}
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func fzHP(rs []Rule, h flow.Hdrs) bool {
	for _, r := range rs {
		if fzMatch(r, h) {
			return true
		}
	}
	return false
}

// fzGated says whether an HP frame past the endpoint, L2 and TTL checks can be asked about
// (TCP/UDP with ports), and fzAllowed which of those flows the test made accepted by the normal
// path (conntrack entry, FORWARD verdict): a few source ports, half the destination ports, so
// both outcomes occur and few entries need inserting (conntrack(8) runs once per flow).
func fzGated(h flow.Hdrs) bool {
	return h.HasPorts && !h.Frag && (h.Key.Proto == 6 || h.Key.Proto == 17)
}

func fzAllowed(h flow.Hdrs) bool {
	sp := h.Key.Sport
	return fzGated(h) && (sp == 5000 || sp == 80 || sp == 53 || sp == 1) && (sp^h.Key.Dport)&1 == 0
}

// fzFrame is a frame of h's flow (for the gate's helpers).
func fzFrame(h flow.Hdrs) frame {
	return frame{v6: h.Family == 6, saddr: fzAddr(h.Family, h.Key.Src).String(), daddr: fzAddr(h.Family, h.Key.Dst).String(),
		proto: h.Key.Proto, sport: h.Key.Sport, dport: h.Key.Dport}
}

// modelVX is prg_prism_vx's decision: verdict and the frame after it.
func modelVX(rs []Rule, routed bool, b []byte) (uint32, []byte) {
	h, r := flow.ParseFrame(b, 0, 0)
	if r != flow.OK || !fzHP(rs, h) {
		return tcxNext, b
	}
	kind, ok := fzEpKind[fzAddr(h.Family, h.Key.Dst)]
	switch {
	case !ok:
		return tcxNext, b
	case kind != 0:
		return tcShot, b
	}
	if !routed {
		if !bytes.Equal(b[:6], ctrMAC) || !fzAllowed(h) {
			return tcxNext, b
		}
		return tcRedirect, b
	}
	if !bytes.Equal(b[:6], vtepMAC) || h.TTL <= 1 || !fzAllowed(h) {
		return tcxNext, b
	}
	out := append(append(append([]byte{}, ctrMAC...), brMAC...), b[12:]...)
	if h.Family == 4 {
		old := uint32(binary.BigEndian.Uint16(out[22:]))
		out[22]--
		c := uint32(^binary.BigEndian.Uint16(out[24:])) + (^old & 0xffff) + uint32(binary.BigEndian.Uint16(out[22:]))
		c = c&0xffff + c>>16
		c = c&0xffff + c>>16
		binary.BigEndian.PutUint16(out[24:], ^uint16(c))
	} else {
		out[14+7]--
	}
	return tcRedirect, out
}

// fzInner is an inner frame: IPv4 or IPv6 (with extension headers), TCP/UDP/SCTP/ICMP/other,
// ports, addresses, DSCP and MACs drawn so that every rule, endpoint kind and check is hit and
// missed; a third of them damaged once, an eighth random.
func fzInner(rng *rand.Rand) []byte {
	if rng.IntN(8) == 0 {
		return frames.Random(rng, []uint16{4789, 8472})
	}
	pick := func(s []string) netip.Addr { return netip.MustParseAddr(s[rng.IntN(len(s))]) }
	v6 := rng.IntN(2) == 0
	var src, dst netip.Addr
	for src, dst = pick(fzSrcs), pick(fzDsts); src.Is6() != v6 || dst.Is6() != v6; src, dst = pick(fzSrcs), pick(fzDsts) {
	}
	protos := []byte{6, 17, 132, 1, 58, 47}
	proto := protos[rng.IntN(len(protos))]
	sport, dport := fzPorts[rng.IntN(len(fzPorts))], fzPorts[rng.IntN(len(fzPorts))]
	if rng.IntN(4) == 0 {
		sport = uint16(5000 + rng.IntN(1000))
	}
	var l4 []byte
	switch proto {
	case 6:
		l4 = frames.TCP(sport, dport, make([]byte, rng.IntN(64)))
	case 17, 132:
		l4 = frames.UDP(sport, dport, make([]byte, rng.IntN(64)))
	default:
		l4 = make([]byte, 8+rng.IntN(32))
	}
	tos := byte(rng.IntN(256))
	if rng.IntN(3) == 0 {
		tos = 46<<2 | byte(rng.IntN(4)) // ef
	}
	ttls := []byte{1, 2, 64, 255}
	ttl := ttls[rng.IntN(len(ttls))]
	macs := []net.HardwareAddr{ctrMAC, vtepMAC, fzOther, {0x01, 0, 0x5e, 0, 0, 1}}
	dmac := macs[rng.IntN(len(macs))]
	var f []byte
	if !v6 {
		h := frames.IPv4{Src: src, Dst: dst, Proto: proto, TOS: tos, TTL: ttl, ID: uint16(rng.Uint32())}
		if rng.IntN(12) == 0 {
			h.FragOff = uint16(rng.IntN(2))<<13 | uint16(rng.IntN(3))
		}
		f = frames.EthMAC(dmac, srcCtrMAC, 0x0800, h.Wrap(l4))
	} else {
		h := frames.IPv6{Src: src, Dst: dst, Next: proto, TClass: tos, HopLimit: ttl}
		for i := rng.IntN(7); i > 4; i-- { // up to two extension headers, a few times past the walk's limit
			for j := i - 4; j > 0; j-- {
				kinds := []byte{0, 43, 60, 44}
				k := kinds[rng.IntN(len(kinds))]
				h.Ext, h.Next = append(frames.Ext(h.Next), h.Ext...), k
			}
		}
		f = frames.EthMAC(dmac, srcCtrMAC, 0x86dd, h.Wrap(l4))
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+40+24+20)
	}
	return f
}

func TestFuzzVX(t *testing.T) {
	for _, routed := range []bool{false, true} {
		e, rs := newFzEnv(t, routed)
		rng := rand.New(rand.NewPCG(21, 22))
		n, hits, runs, kinds := frames.FuzzCount(20000)/2, 0, 0, map[uint32]int{}
		allowed := map[prsPrismFlowKey]bool{}
		check := func(b []byte) {
			if t.Failed() {
				return
			}
			runs++
			in := append([]byte{}, b...)
			if h, r := flow.ParseFrame(b, 0, 0); r == flow.OK && fzAllowed(h) {
				f := fzFrame(h)
				if k := e.flowKey(f); !allowed[k] {
					e.ctInsertNew(f)
					allowed[k] = true
				}
				e.forwarded(f, 0, 0) // fresh, so the run is never a re-verification
			}
			ret, out := e.run(b)
			wret, want := modelVX(rs, routed, in)
			kinds[ret]++
			if ret != wret || !bytes.Equal(out, want) {
				t.Errorf("routed=%v: verdict %d, model %d; frame as the model %v\n in % x\nout % x\nwant % x", routed, int32(ret), int32(wret), bytes.Equal(out, want), in, out, want)
			}
			if wret == tcRedirect {
				hits++
			}
		}
		frames.Each(t.Failed, n, 2048, func() []byte { return fzInner(rng) }, check)
		t.Logf("routed=%v: %d frames by verdict %v", routed, runs, kinds)
		if hits == 0 || kinds[tcShot] == 0 || kinds[tcxNext] == 0 {
			t.Fatalf("routed=%v: verdicts %v: the generator misses a path", routed, kinds)
		}
	}
}

func TestFuzzNIC(t *testing.T) {
	for _, c := range []*isoConfig{plan([]int{3}, []int{2}), plan([]int{3, 5}, []int{0, 2, 4})} {
		e, rs := newFzEnv(t, false)
		if err := e.o.writeIso(c, []uint16{4789, 8472}); err != nil {
			t.Fatal(err)
		}
		pinThread(t, 0)
		ports := []uint16{4789, 8472}
		rng := rand.New(rand.NewPCG(31, 32))
		n, runs, steered, hp := frames.FuzzCount(20000)/2, 0, 0, 0
		ncpu, err := ebpf.PossibleCPU()
		if err != nil {
			t.Fatal(err)
		}
		mark := make([]prsPrismLast, ncpu)
		for i := range mark {
			mark[i].Hp = 0xff
		}
		check := func(b []byte) {
			if t.Failed() {
				return
			}
			runs++
			if err := e.o.PrgPrismLast.Put(uint32(0), mark); err != nil {
				t.Fatal(err)
			}
			in := append([]byte{}, b...)
			opts := &ebpf.RunOptions{Data: b, DataOut: make([]byte, len(b)+256)}
			ret, err := e.o.PrgPrismNic.Run(opts)
			if err != nil {
				t.Fatalf("test run: %v", err)
			}
			if ret != tcxNext || !bytes.Equal(opts.DataOut, in) {
				t.Errorf("verdict %d, frame changed: % x", int32(ret), in)
				return
			}
			var per []prsPrismLast
			if err := e.o.PrgPrismLast.Lookup(uint32(0), &per); err != nil {
				t.Fatal(err)
			}
			got := per[0]
			off, _, r := flow.VXLANOuter(in, ports)
			if r != flow.OK {
				if got.Hp != 0xff {
					t.Errorf("not VXLAN to %v, steered: %+v: % x", ports, got, in)
				}
				return
			}
			h, r := flow.ParseFrame(in, off, 0)
			var fh uint32
			isHP := false
			if r == flow.OK {
				fh, isHP = h.Key.Hash(), fzHP(rs, h)
			}
			idx, hash := c.steer(isHP, fh, 0)
			want := prsPrismLast{Hp: map[bool]uint32{true: 1}[isHP], Idx: idx, Hash: hash, FlowHash: fh, Cpu: 0}
			if got != want {
				t.Errorf("plan %v: steered %+v, model %+v: % x", c, got, want, in)
			}
			steered++
			if isHP {
				hp++
			}
		}
		frames.Each(t.Failed, n, 2048, func() []byte {
			if rng.IntN(6) == 0 {
				return frames.Random(rng, ports)
			}
			port := ports[rng.IntN(2)]
			if rng.IntN(10) == 0 {
				port = 9999
			}
			f := frames.Encap(uint16(rng.Uint32()), port, rng.Uint32()&0xffffff, fzInner(rng))
			if rng.IntN(4) == 0 {
				f = frames.Mutate(rng, f, 50+14+40+24+20)
			}
			return f
		}, check)
		t.Logf("plan %v: %d frames, %d steered, %d of them HP", c, runs, steered, hp)
		if steered == 0 || hp == 0 || hp == steered {
			t.Fatalf("plan %v: %d steered, %d HP: the generator misses a path", c, steered, hp)
		}
	}
}
