package fastpath

import (
	"encoding/binary"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func tupleAttr(t ctTuple) []byte {
	var ip, proto, tuple []byte
	ip = nlAttr(ip, nl.CTA_IP_V4_SRC, be32(t.src))
	ip = nlAttr(ip, nl.CTA_IP_V4_DST, be32(t.dst))
	proto = nlAttr(proto, nl.CTA_PROTO_NUM, []byte{t.proto})
	proto = nlAttr(proto, nl.CTA_PROTO_SRC_PORT, be16(t.sport))
	proto = nlAttr(proto, nl.CTA_PROTO_DST_PORT, be16(t.dport))
	tuple = nlAttr(tuple, nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, ip)
	return nlAttr(tuple, nl.CTA_TUPLE_PROTO|unix.NLA_F_NESTED, proto)
}

// TestParseCTEvent: a DESTROY event of a DNAT'd entry (pod -> ClusterIP, reply from the
// backend) gives the keys of the client's flow, the backend's reply (the alias) and the
// backend node's flow; an IPv6 or truncated message gives nothing.
func TestParseCTEvent(t *testing.T) {
	pod, vip, be := uint32(0x0202_13c6), uint32(0x01ff_12c6), uint32(0x0302_13c6)
	orig := ctTuple{src: pod, dst: vip, sport: 0x3930, dport: 0x5000, proto: 17}
	reply := ctTuple{src: be, dst: pod, sport: 0x901f, dport: 0x3930, proto: 17}
	msg := []byte{unix.AF_INET, 0, 0, 0}
	msg = nlAttr(msg, nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, tupleAttr(orig))
	msg = nlAttr(msg, nl.CTA_TUPLE_REPLY|unix.NLA_F_NESTED, tupleAttr(reply))
	msg = nlAttr(msg, nl.CTA_STATUS, []byte{0, 0, 0, 8})
	e, ok := parseCTEvent(msg)
	if !ok || e.orig != orig || e.reply != reply {
		t.Fatalf("parse = %+v, %v; want %+v %+v", e, ok, orig, reply)
	}
	b := ctBatch{keys: map[ctKey]bool{}}
	b.add(e)
	for what, k := range map[string]ctKey{
		"client's flow":       {pod, vip, 0x3930, 0x5000, 17},
		"alias (backend)":     {pod, be, 0x3930, 0x901f, 17},
		"backend node's flow": {be, pod, 0x901f, 0x3930, 17},
	} {
		if !b.keys[k] {
			t.Errorf("batch lacks the %s key %+v", what, k)
		}
	}
	v6 := append([]byte{unix.AF_INET6, 0, 0, 0}, msg[4:]...)
	if _, ok := parseCTEvent(v6); ok {
		t.Error("an IPv6 event parsed")
	}
	for n := range len(msg) {
		_, _ = parseCTEvent(msg[:n]) // truncated: no panic
	}
}

// TestAppendCTLiberal: the update names the entry by its tuple and sets the liberal flag,
// masked, on both directions.
func TestAppendCTLiberal(t *testing.T) {
	tu := ctTuple{src: 1, dst: 2, sport: 3, dport: 4, proto: 6}
	b := appendCTLiberal(nil, tu, 7)
	if l := binary.NativeEndian.Uint32(b); int(l) != len(b) {
		t.Fatalf("nlmsg_len %d, message %d bytes", l, len(b))
	}
	if typ := binary.NativeEndian.Uint16(b[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTNew {
		t.Fatalf("type %#x", typ)
	}
	if fl := binary.NativeEndian.Uint16(b[6:]); fl&unix.NLM_F_CREATE != 0 {
		t.Fatal("NLM_F_CREATE: the update could make an entry")
	}
	var got ctTuple
	var flags [][]byte
	nlAttrs(b[unix.NLMSG_HDRLEN+sizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			got, _ = parseCTTuple(v)
		case nl.CTA_PROTOINFO:
			nlAttrs(v, func(_ uint16, v []byte) {
				nlAttrs(v, func(_ uint16, v []byte) { flags = append(flags, v) })
			})
		}
	})
	if got != tu {
		t.Errorf("tuple %+v, want %+v", got, tu)
	}
	if len(flags) != 2 || flags[0][0] != ctTCPFlagBeLiberal || flags[0][1] != ctTCPFlagBeLiberal || flags[1][0] != ctTCPFlagBeLiberal {
		t.Errorf("flags %v, want liberal with its mask on both directions", flags)
	}
}

// TestAppendCTDelete: the delete of a connection closed on the fast path names its entry by
// its tuple, nothing else.
func TestAppendCTDelete(t *testing.T) {
	tu := ctTuple{src: 1, dst: 2, sport: 3, dport: 4, proto: 6}
	b := appendCTDelete(appendCTDelete(nil, tu, 1), ctTuple{src: 5, dst: 6, sport: 7, dport: 8, proto: 6}, 2)
	l := binary.NativeEndian.Uint32(b)
	if typ := binary.NativeEndian.Uint16(b[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTDel {
		t.Fatalf("type %#x", typ)
	}
	if seq := binary.NativeEndian.Uint32(b[l+8:]); seq != 2 {
		t.Fatalf("second message: seq %d at offset %d (first nlmsg_len)", seq, l)
	}
	var got ctTuple
	n := 0
	nlAttrs(b[unix.NLMSG_HDRLEN+sizeofNfgenmsg:l], func(typ uint16, v []byte) {
		n++
		if typ == nl.CTA_TUPLE_ORIG {
			got, _ = parseCTTuple(v)
		}
	})
	if n != 1 || got != tu {
		t.Errorf("%d attributes, tuple %+v; want only the tuple %+v", n, got, tu)
	}
}

// TestMarkDue: a plain flow is due both ways at once; a Service client's egress at once and its
// replies within forgetReplies; a same-node backend's reply flow within forgetReplies; a flow
// already due is left.
func TestMarkDue(t *testing.T) {
	now := uint64(100e9)
	recent := now - 2e9
	lim := now - uint64(2*revalidate) + uint64(forgetReplies)
	for _, c := range []struct {
		name            string
		flags           uint32
		out, in         uint64
		wantOut, wantIn uint64
		changed         bool
	}{
		{"plain", fpFOut | fpFIn, recent, recent, 0, 0, true},
		{"service client", fpFOut | fpFIn | fpFDNAT, recent, recent, 0, lim, true},
		{"service client, replies older", fpFOut | fpFIn | fpFDNAT, recent, lim - 5, 0, lim - 5, true},
		{"same-node backend", fpFOut | fpFIn | fpFSNAT, recent, recent, lim, 0, true},
		{"already due", fpFOut | fpFIn, 0, 0, 0, 0, false},
	} {
		f := fpFpFlow{Flags: c.flags, OutNs: c.out, InNs: c.in}
		ch := markDue(&f, now)
		if ch != c.changed || f.OutNs != c.wantOut || f.InNs != c.wantIn {
			t.Errorf("%s: out %d in %d changed %v, want %d %d %v", c.name, f.OutNs, f.InNs, ch, c.wantOut, c.wantIn, c.changed)
		}
	}
}

func ipsetMsg(name string, refs uint32, members []uint32, timeout uint32) []byte {
	m := []byte{unix.AF_INET, 0, 0, 0}
	m = nlAttr(m, nl.IPSET_ATTR_SETNAME, append([]byte(name), 0))
	m = nlAttr(m, nl.IPSET_ATTR_TYPENAME, []byte("hash:ip\x00"))
	var data []byte
	data = nlAttr(data, nl.IPSET_ATTR_REFERENCES|unix.NLA_F_NET_BYTEORDER, binary.BigEndian.AppendUint32(nil, refs))
	data = nlAttr(data, nl.IPSET_ATTR_ELEMENTS|unix.NLA_F_NET_BYTEORDER, binary.BigEndian.AppendUint32(nil, uint32(len(members))))
	m = nlAttr(m, nl.IPSET_ATTR_DATA|unix.NLA_F_NESTED, data)
	var adt []byte
	for _, a := range members {
		var e []byte
		e = nlAttr(e, nl.IPSET_ATTR_IP|unix.NLA_F_NESTED, nlAttr(nil, 1|unix.NLA_F_NET_BYTEORDER, be32(a)))
		e = nlAttr(e, nl.IPSET_ATTR_TIMEOUT|unix.NLA_F_NET_BYTEORDER, binary.BigEndian.AppendUint32(nil, timeout))
		adt = nlAttr(adt, nl.IPSET_ATTR_DATA|unix.NLA_F_NESTED, e)
	}
	return nlAttr(m, nl.IPSET_ATTR_ADT|unix.NLA_F_NESTED, adt)
}

// TestDigestIPSets: a member added changes a referenced set's digest; a member's remaining
// timeout ticking down does not; an unreferenced set is not watched.
func TestDigestIPSets(t *testing.T) {
	d := func(msgs ...[]byte) map[string]uint64 { return digestIPSets(msgs) }
	base := d(ipsetMsg("deny", 1, []uint32{1, 2}, 60), ipsetMsg("idle", 0, []uint32{1}, 0))
	if _, ok := base["idle"]; ok || len(base) != 1 {
		t.Fatalf("digests %v: want the referenced set only", base)
	}
	if why := ipsetDiff(base, d(ipsetMsg("deny", 1, []uint32{1, 2}, 59), ipsetMsg("idle", 0, []uint32{1, 3}, 0))); why != "" {
		t.Errorf("a timeout ticking, an unreferenced set changing: diff %q, want none", why)
	}
	if why := ipsetDiff(base, d(ipsetMsg("deny", 1, []uint32{1, 3}, 60))); why != "deny" {
		t.Errorf("a member replaced: diff %q, want deny", why)
	}
	if why := ipsetDiff(base, d()); why != "deny" {
		t.Errorf("the set gone: diff %q, want deny", why)
	}
}
