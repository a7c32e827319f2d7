package fastpath

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// ctEventMsg is a DESTROY event as ctnetlink_conntrack_event lays it out: the netlink header,
// nfgenmsg, the original and reply tuples, CTA_ID, CTA_STATUS, then counters and the like
// (extra: attributes after the status), and for a TCP entry of a state (state > 0) its
// CTA_PROTOINFO last, as a DESTROY event has it.
func ctEventMsg(v6 bool, proto uint8, status uint32, extra bool, state ...uint8) []byte {
	a, b, fam := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2"), byte(unix.AF_INET)
	if v6 {
		a, b, fam = netip.MustParseAddr("fd00:244:1::2"), netip.MustParseAddr("fd00:244:2::2"), unix.AF_INET6
	}
	msg := []byte{fam, 0, 0, 0}
	msg = append(msg, ctnl.TupleAttr(ctnl.Tuple{Src: a, Dst: b, Sport: 40000, Dport: 80, Proto: proto})...)
	r := ctnl.TupleAttr(ctnl.Tuple{Src: b, Dst: a, Sport: 80, Dport: 40000, Proto: proto})
	msg = nlAttr(msg, nl.CTA_TUPLE_REPLY|unix.NLA_F_NESTED, r[unix.SizeofNlAttr:])
	msg = nlAttr(msg, 12 /* CTA_ID */, binary.BigEndian.AppendUint32(nil, 0xdeadbeef))
	msg = nlAttr(msg, nl.CTA_STATUS, binary.BigEndian.AppendUint32(nil, status))
	if extra {
		msg = nlAttr(msg, 9|unix.NLA_F_NESTED /* CTA_COUNTERS_ORIG */, make([]byte, 20))
		msg = nlAttr(msg, 8 /* CTA_MARK */, make([]byte, 4))
	}
	if len(state) > 0 {
		st := nlAttr(nil, 1 /* CTA_PROTOINFO_TCP_STATE */, []byte{state[0]})
		st = nlAttr(st, 2 /* CTA_PROTOINFO_TCP_WSCALE_ORIGINAL */, []byte{7})
		msg = nlAttr(msg, 4|unix.NLA_F_NESTED /* CTA_PROTOINFO */, nlAttr(nil, 1|unix.NLA_F_NESTED /* CTA_PROTOINFO_TCP */, st))
	}
	return nlMsg(unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTDel, msg)
}

// nlMsg is payload behind a netlink header of type typ.
func nlMsg(typ uint16, payload []byte) []byte {
	h := make([]byte, unix.SizeofNlMsghdr)
	binary.NativeEndian.PutUint32(h, uint32(len(h)+len(payload)))
	binary.NativeEndian.PutUint16(h[4:], typ)
	return append(h, payload...)
}

func ctFilterVM(t testing.TB) *bpf.VM {
	t.Helper()
	raw, err := ctDestroyFilter()
	if err != nil {
		t.Fatal(err)
	}
	ins, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter does not disassemble")
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatalf("the filter is not a valid program: %v", err)
	}
	return vm
}

// kept runs the filter on msg: true when the socket would receive it.
func kept(t testing.TB, vm *bpf.VM, msg []byte) bool {
	t.Helper()
	n, err := vm.Run(msg)
	if err != nil {
		t.Fatalf("filter: %v", err)
	}
	if n != 0 && n < len(msg) {
		t.Fatalf("the filter keeps %d of %d bytes", n, len(msg))
	}
	return n != 0
}

// TestCTDestroyFilter: the subscription's socket filter drops the events the agent skips
// (closedFast: TCP, IPS_FIXED_TIMEOUT) and those of TCP entries that ended through conntrack
// (TIME_WAIT, CLOSE), IPv4 and IPv6, and passes every other one.
func TestCTDestroyFilter(t *testing.T) {
	vm := ctFilterVM(t)
	for _, c := range []struct {
		name   string
		msg    []byte
		wantIn bool
	}{
		{"expired at the close, IPv4", ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, true), false},
		{"expired at the close, IPv6", ctEventMsg(true, unix.IPPROTO_TCP, 2|8|1024, true), false},
		{"expired, status last", ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, false), false},
		{"an ordinary TCP entry", ctEventMsg(false, unix.IPPROTO_TCP, 2|8, true), true},
		{"an ordinary IPv6 TCP entry", ctEventMsg(true, unix.IPPROTO_TCP, 2|4|8, true), true},
		{"UDP with a fixed timeout", ctEventMsg(false, unix.IPPROTO_UDP, 8|1024, true), true},
		{"bit 10 in the wrong byte order", ctEventMsg(false, unix.IPPROTO_TCP, 0x00040000, true), true},
		{"a NEW message", func() []byte {
			m := ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, true)
			binary.NativeEndian.PutUint16(m[4:], unix.NFNL_SUBSYS_CTNETLINK<<8|0)
			return m
		}(), true},
		{"another subsystem", func() []byte {
			m := ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, true)
			binary.NativeEndian.PutUint16(m[4:], unix.NFNL_SUBSYS_CTNETLINK_EXP<<8|ipctnlMsgCTDel)
			return m
		}(), true},
		{"headers only", nlMsg(unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTDel, []byte{unix.AF_INET, 0, 0, 0}), true},
		{"truncated in the status", func() []byte {
			m := ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, false)
			return m[:len(m)-2]
		}(), true},
		{"a message shorter than its header", []byte{1, 2, 3}, true},
		{"ended through conntrack: TIME_WAIT", ctEventMsg(false, unix.IPPROTO_TCP, 2|4|8, true, ctTCPTimeWait), false},
		{"ended through conntrack: CLOSE (a RST), IPv6", ctEventMsg(true, unix.IPPROTO_TCP, 2|4|8, false, ctTCPClose), false},
		{"ESTABLISHED (conntrack -D of a live connection)", ctEventMsg(false, unix.IPPROTO_TCP, 2|4|8, true, 3), true},
		{"FIN_WAIT (half closed: data may still come)", ctEventMsg(false, unix.IPPROTO_TCP, 2|4|8, true, 4), true},
		{"SYN_RECV, handshake-only, not marked", ctEventMsg(false, unix.IPPROTO_TCP, 2|8, true, 2), true},
		{"expired at the close, with its state", ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, true, 2), false},
	} {
		if got := kept(t, vm, c.msg); got != c.wantIn {
			t.Errorf("%s: received %v, want %v", c.name, got, c.wantIn)
		}
		// What the agent skips itself (closedFast) the filter drops.
		if len(c.msg) > unix.SizeofNlMsghdr {
			if e, ok := parseCTEvent(c.msg[unix.SizeofNlMsghdr:]); ok && e.closedFast() && c.msg[4] == ipctnlMsgCTDel && c.msg[5] == unix.NFNL_SUBSYS_CTNETLINK && kept(t, vm, c.msg) {
				t.Errorf("%s: closedFast, but the filter keeps it", c.name)
			}
		}
		if got := ctFilterSpec(c.msg); got != c.wantIn {
			t.Errorf("%s: the spec keeps it %v, want %v", c.name, got, c.wantIn)
		}
	}
}

// ctFilterSpec is what the filter is meant to do, in Go: drop (false) a ctnetlink DELETE whose
// first top-level CTA_STATUS (among the first ctFilterSteps attributes) has IPS_FIXED_TIMEOUT
// and whose first CTA_TUPLE_ORIG holds, first, a CTA_TUPLE_PROTO whose first CTA_PROTO_NUM is
// TCP, or whose CTA_PROTOINFO's CTA_PROTOINFO_TCP's state is TIME_WAIT or CLOSE; keep
// everything else, a malformed message included.
func ctFilterSpec(m []byte) bool {
	if len(m) < 6 || m[4] != ipctnlMsgCTDel || m[5] != unix.NFNL_SUBSYS_CTNETLINK {
		return true
	}
	find := func(b []byte, typ uint16, minLen int) []byte {
		for i := 0; i < ctFilterSteps && len(b) >= unix.SizeofNlAttr; i++ {
			l := int(binary.NativeEndian.Uint16(b))
			if l < unix.SizeofNlAttr || l > len(b) {
				return nil
			}
			if binary.NativeEndian.Uint16(b[2:])&nlaTypeMask == typ {
				if l < unix.SizeofNlAttr+minLen {
					return nil
				}
				return b[unix.SizeofNlAttr:l]
			}
			a := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
			if a > len(b) {
				return nil
			}
			b = b[a:]
		}
		return nil
	}
	hdr := unix.SizeofNlMsghdr + sizeofNfgenmsg
	if len(m) < hdr {
		return true
	}
	if st := find(m[hdr:], nl.CTA_STATUS, 4); st != nil && binary.BigEndian.Uint32(st)&ipsFixedTimeout != 0 {
		num := find(find(find(m[hdr:], nl.CTA_TUPLE_ORIG, 0), nl.CTA_TUPLE_PROTO, 0), nl.CTA_PROTO_NUM, 1)
		if num != nil && num[0] == unix.IPPROTO_TCP {
			return false
		}
	}
	state := find(find(find(m[hdr:], 4 /* CTA_PROTOINFO */, 0), 1 /* CTA_PROTOINFO_TCP */, 0), 1 /* ..._STATE */, 1)
	return state == nil || (state[0] != ctTCPTimeWait && state[0] != ctTCPClose)
}

// TestCTDestroyFilterHostile: damaged and random messages (lengths past the end, zero, odd,
// types with flags, bytes flipped anywhere) never make the filter drop what the spec keeps,
// nor read past the message (a classic BPF load out of bounds drops the packet).
func TestCTDestroyFilterHostile(t *testing.T) {
	vm := ctFilterVM(t)
	rng := rand.New(rand.NewPCG(29, 1))
	bases := [][]byte{
		ctEventMsg(false, unix.IPPROTO_TCP, 2|8|1024, true), ctEventMsg(true, unix.IPPROTO_TCP, 2|8|1024, false),
		ctEventMsg(false, unix.IPPROTO_UDP, 1024, true), ctEventMsg(false, unix.IPPROTO_TCP, 8, true),
		ctEventMsg(false, unix.IPPROTO_TCP, 2|4|8, true, ctTCPTimeWait), ctEventMsg(true, unix.IPPROTO_TCP, 2|4|8, false, 3),
	}
	drops := 0
	for i := 0; i < 200000; i++ {
		m := append([]byte(nil), bases[i%len(bases)]...)
		switch rng.IntN(4) {
		case 0: // flip a few bytes
			for n := 1 + rng.IntN(3); n > 0; n-- {
				m[rng.IntN(len(m))] = byte(rng.Uint32())
			}
		case 1: // truncate
			m = m[:rng.IntN(len(m)+1)]
		case 2: // a length field (the first two bytes of some attribute-aligned word) rewritten
			at := unix.SizeofNlMsghdr + sizeofNfgenmsg + 4*rng.IntN((len(m)-20)/4)
			binary.NativeEndian.PutUint16(m[at:], uint16(rng.IntN(80)))
		case 3: // random bytes behind the headers of a DELETE
			m = m[:unix.SizeofNlMsghdr+sizeofNfgenmsg+rng.IntN(40)]
			for j := unix.SizeofNlMsghdr + sizeofNfgenmsg; j < len(m); j++ {
				m[j] = byte(rng.Uint32())
			}
		}
		got, want := kept(t, vm, m), ctFilterSpec(m)
		if got != want {
			t.Fatalf("message %x: filter keeps %v, spec %v", m, got, want)
		}
		if !got {
			drops++
		}
	}
	if drops == 0 {
		t.Fatal("no damaged message was dropped: the test exercised nothing")
	}
}
