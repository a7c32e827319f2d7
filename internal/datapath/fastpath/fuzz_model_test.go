package fastpath

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// The Go model of the fast-path programs the fuzz tests hold them to: what each program
// parses, whether it takes a frame and the frame it must make of it.

// fzPkt is struct fp_pkt as the model reads it.
type fzPkt struct {
	dst, src     []byte
	l3           int
	saddr, daddr uint32
	sport, dport uint16 // as in memory (network order read as little-endian)
	proto, ttl   uint8
	tos, hdrs    uint8
	ctl          uint8 // TCP: FIN 1, SYN 2, RST 4 (t[13] & 7)
}

const fzParsed = 0

// fzParse is parse_at as the fast path's programs take it: 0 and the inner packet, or a
// non-zero reason it takes the normal path (a TCP SYN, FIN or RST among them).
func fzParse(b []byte, off int) (fzPkt, int) { return fzParseCtl(b, off, 7) }

// fzParseLearn is parse_at as the learners take it: a SYN is learned from, FIN and RST are not.
func fzParseLearn(b []byte, off int) (fzPkt, int) { return fzParseCtl(b, off, 5) }

func fzParseCtl(b []byte, off int, ctlStop uint8) (fzPkt, int) {
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
		if t == nil || t[13]&ctlStop != 0 {
			return p, 3
		}
		p.hdrs, p.ctl = 20+(t[12]>>4)*4, t[13]&7
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

// fzParseFast is parse_at and begin_out (out) or begin_in's test of a TCP control segment: a
// SYN (SYN-ACK) takes the normal path, which conntrack decides on and the flow is learned from;
// a FIN or RST (with any other bit but SYN alone) takes it too unless its flow is handshake-only
// (fin_fast: conntrack saw only the handshake, so the close rides the fast path like the data
// before it, and the agent deletes conntrack's entry, ctclosed.go). The test looks at the
// flow as the table holds it, learned both ways or not; the rest of the lookup decides after.
func (e *fzEnv) fzParseFast(b []byte, off int, out bool) (fzPkt, int) {
	p, r := fzParseCtl(b, off, 0)
	if r != fzParsed || p.ctl == 0 {
		return p, r
	}
	if p.ctl == 2 {
		return p, 3
	}
	k := p.keyIn()
	if out {
		k = p.keyOut()
	}
	if f, ok := e.flows[k]; !ok || f.Flags&(fAlias|fLocal) != 0 || f.Flags&fHsOnly == 0 {
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
	p, r := e.fzParseFast(b, 0, true)
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
	p, r := e.fzParseFast(b, 50, false)
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

// learnable parses frame b (its inner frame at off) and finds the model's flow for its egress
// (out) or ingress key; ok when the normal path has seen the flow at a TTL no lower than the
// frame's, so the learner may complete that direction.
func (e *fzEnv) learnable(b []byte, off int, out bool) (p fzPkt, k fpFpKey, f fpFpFlow, ok bool) {
	p, r := fzParseLearn(b, off)
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

// hsLearned is hs_learned: a TCP direction learned from a SYN (SYN-ACK) leaves the connection
// handshake-only (its FIN and RST ride the fast path), one learned from anything else ends it.
func hsLearned(flags uint32, p fzPkt) uint32 {
	switch {
	case p.proto != 6:
		return flags
	case p.ctl == 2:
		return flags | fHsOnly
	default:
		return flags &^ fHsOnly
	}
}
