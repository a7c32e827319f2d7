package ezpath

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

// Fuzzing EZPath's host programs (prg_ezp_port, _relay, _uplink, _deliver) and the ToR's
// (prg_ezp_tor_dn, _tor_up) against a Go model of their tables: frames of offloaded and other
// flows, tagged with known and unknown VIDs (sometimes twice), VXLAN of the overlay and of the
// offload to this ToR's VTEP and others, random ones, damaged and truncated at every offset.
// Each program's verdict and the frame after it equal the model's (a frame left to the kernel is
// unchanged; an encapsulated one is byte for byte what the model builds, its outer MACs naming
// the one underlay route the model picks); the ToR's flow register counts exactly the model's
// flows. A test run does not return the skb's VLAN metadata or a redirect's target: a pushed
// tag and the target ifindex are covered by the lab test, their table entries by the MACs here.

var (
	fzIPs    = []netip.Addr{ipA, ipB, netip.MustParseAddr("198.19.2.3"), netip.MustParseAddr("198.19.2.4"), netip.MustParseAddr("198.19.2.5")}
	fzVIDs   = []uint16{testVID, testVID + 1, 7}
	fzVTEPs  = []netip.Addr{tor1, tor2, h2, netip.MustParseAddr("198.18.0.3")}
	fzVNIs   = []uint32{testVNI, testVNI + 1, 5}
	fzCtrMAC = map[uint32]net.HardwareAddr{77: {0x02, 0x42, 0, 0, 77, 2}, 78: {0x02, 0x42, 0, 0, 78, 2}}
)

// fzFrame is an inner frame between the tenants' containers (IPv4 TCP/UDP, IPv6, ARP,
// broadcast), maybe tagged once or twice, maybe inside VXLAN, a third damaged, an eighth random.
func fzFrame(rng *rand.Rand) []byte {
	if rng.IntN(8) == 0 {
		return frames.Random(rng, []uint16{4789})
	}
	pick := func(s []netip.Addr) netip.Addr { return s[rng.IntN(len(s))] }
	dmac := []net.HardwareAddr{macB, macA, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {0x01, 0, 0x5e, 0, 0, 1}}[rng.IntN(4)%3*rng.IntN(2)]
	var f []byte
	switch rng.IntN(10) {
	case 0:
		f = frames.EthMAC(dmac, macA, 0x0806, make([]byte, 28))
	case 1:
		f = frames.EthMAC(dmac, macA, 0x86dd, frames.IPv6{Src: frames.Addr("fd00::1"), Dst: frames.Addr("fd00::2"), Next: 17}.Wrap(frames.UDP(1, 2, nil)))
	default:
		proto := []byte{6, 17, 1}[rng.IntN(3)]
		f = frames.EthMAC(dmac, macA, 0x0800, frames.IPv4{Src: pick(fzIPs), Dst: pick(fzIPs), Proto: proto, TTL: 64}.Wrap(frames.L4(proto, uint16(40000+rng.IntN(3)), 5201, rng.IntN(80))))
	}
	for i := rng.IntN(4); i > 0 && i < 3; i-- {
		f = frames.Tag(f, fzVIDs[rng.IntN(len(fzVIDs))])
	}
	if rng.IntN(3) == 0 {
		port := uint16(4789)
		if rng.IntN(8) == 0 {
			port = 8472
		}
		dst := pick(fzVTEPs)
		if rng.IntN(2) == 0 {
			dst = tor1
		}
		f = vxlanFrame(f, pick(fzVTEPs), dst, fzVNIs[rng.IntN(len(fzVNIs))], port)
		if rng.IntN(10) == 0 {
			f[14+20+8] = byte(rng.Uint32())
		}
		if rng.IntN(10) == 0 { // outer IPv4 options: the inner frame is not where decap cuts
			f = frames.IPv4Options(f, 14, []byte{1, 1, 1, 0})
		}
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+8+20+8+8+14+8+20+20)
	}
	return f
}

// fzVID is ezp_vid on a frame from a test run (no hardware tag): the VID of an 802.1Q tag in
// the data, -1 without one.
func fzVID(b []byte) int {
	if len(b) < 18 || binary.BigEndian.Uint16(b[12:]) != 0x8100 {
		return -1
	}
	return int(binary.BigEndian.Uint16(b[14:]) & 0xfff)
}

// fzPop is bpf_skb_vlan_pop on such a frame: the tag leaves the data, and a second tag behind it
// moves into the skb's metadata (skb_vlan_pop). ok false where the kernel fails (a second tag
// cut short), with the data as the failed pop leaves it.
func fzPop(b []byte) ([]byte, bool) {
	out := append(append([]byte{}, b[:12]...), b[16:]...)
	if et := binary.BigEndian.Uint16(out[12:]); et == 0x8100 || et == 0x88a8 {
		if len(out) < 18 {
			return out, false
		}
		out = append(out[:12], out[16:]...)
	}
	return out, true
}

func fzCheck(t *testing.T, name string, p *ebpf.Program, in []byte, wret uint32, want []byte) {
	t.Helper()
	ret, out := runProg(t, p, append([]byte{}, in...))
	if ret != wret || !bytes.Equal(out, want) {
		t.Errorf("%s: verdict %d, model %d; frame as the model %v\n in % x\nout % x\nwant % x", name, int32(ret), int32(wret), bytes.Equal(out, want), in, out, want)
	}
}

func fzHost(t *testing.T) *hostObjects {
	o := hostForTest(t)
	must(t, o.EzpHostEgress.Put(hostEzpEgressKey{Ifindex: 1, Dst: nbo(ipB)}, hostEzpEgressVal{Vid: testVID}))
	must(t, o.EzpHostEgress.Put(hostEzpEgressKey{Ifindex: 1, Dst: nbo(fzIPs[2])}, hostEzpEgressVal{Vid: testVID + 1}))
	must(t, o.EzpHostEgress.Put(hostEzpEgressKey{Ifindex: 2, Dst: nbo(ipA)}, hostEzpEgressVal{Vid: testVID})) // another veth
	must(t, o.EzpHostVid.Put(uint32(testVID), hostEzpVidVal{Domain: 77}))
	must(t, o.EzpHostVid.Put(uint32(testVID+1), hostEzpVidVal{Domain: 78}))
	// Domain 77: ipB live, .2.3 gone, .2.4 without a devmap slot, .2.5 whose slot holds another
	// device. Domain 78 (the other tenant reuses ipB): ipB live with its own MAC.
	slot := uint32(10)
	pod := func(domain uint32, a netip.Addr, ifindex uint32, gone, withSlot bool) {
		slot++
		v := hostPrgPod{Slot: slot, Ifindex: ifindex, CtrMac: mac6(fzCtrMAC[domain])}
		if gone {
			v.Flags = 1
		}
		if withSlot {
			must(t, o.PrgEzpPodport.Put(slot, hostBpfDevmapVal{Ifindex: 1}))
		}
		must(t, o.PrgEzpEp.Put(hostPrgPodKey{Netns: domain, Family: 4, Addr: [4]uint32{nbo(a)}}, v))
	}
	pod(77, ipB, 1, false, true)
	pod(77, fzIPs[2], 1, true, true)
	pod(77, fzIPs[3], 1, false, false)
	pod(77, fzIPs[4], 9, false, true)
	pod(78, ipB, 1, false, true)
	return o
}

// fzLive is the pod table's live endpoints: (domain, address).
var fzLive = map[[2]uint32]bool{{77, nbo(ipB)}: true, {78, nbo(ipB)}: true}

// fzIPv4Hdr: the version/IHL byte of a header the host programs read as IPv4.
func fzIPv4Hdr(vihl byte) bool { return vihl>>4 == 4 && vihl&0xf >= 5 }

func TestFuzzHost(t *testing.T) {
	o := fzHost(t)
	rng := rand.New(rand.NewPCG(81, 82))
	n := frames.FuzzCount(5000) // frames through each of the four programs
	egress := map[uint32]bool{nbo(ipB): true, nbo(fzIPs[2]): true}
	vids := map[int]uint32{testVID: 77, testVID + 1: 78}
	counts := map[string]int{}
	runs := frames.Each(t.Failed, n, 2048, func() []byte { return fzFrame(rng) }, func(b []byte) {
		// prg_ezp_port: unicast IPv4 (ethertype, version 4 and IHL >= 5, no tag) to an offloaded
		// destination from this veth is tagged (metadata) and redirected to ezp0; the rest goes
		// on unchanged.
		ret := verdictNext
		if b[0]&1 == 0 && binary.BigEndian.Uint16(b[12:]) == 0x0800 && len(b) >= 34 && fzIPv4Hdr(b[14]) && egress[binary.LittleEndian.Uint32(b[30:])] {
			ret = verdictRedirect
			counts["tagged"]++
		}
		fzCheck(t, "port", o.PrgEzpPort, b, ret, b)
		// prg_ezp_relay and prg_ezp_uplink: tagged frames are redirected, the others dropped by
		// the relay (nothing untagged may come there) and left alone by the uplink.
		vid := fzVID(b)
		ret, up := verdictShot, verdictNext
		if vid >= 0 {
			ret, up = verdictRedirect, verdictRedirect
		}
		fzCheck(t, "relay", o.PrgEzpRelay, b, ret, b)
		fzCheck(t, "uplink", o.PrgEzpUplink, b, up, b)
		// prg_ezp_deliver: a tagged IPv4 frame of a tenant to a live pod of that tenant loses the
		// tag, gets the pod's MAC and goes in; everything else is dropped unchanged.
		ret, want := verdictShot, b
		if domain, ok := vids[vid]; ok {
			u, ok := fzPop(b)
			want = u // dropped after the pop: the frame as the pop left it
			if ok && binary.BigEndian.Uint16(u[12:]) == 0x0800 && len(u) >= 34 && fzIPv4Hdr(u[14]) && fzLive[[2]uint32{domain, binary.LittleEndian.Uint32(u[30:])}] {
				ret, want = verdictRedirect, append(append([]byte{}, fzCtrMAC[domain]...), u[6:]...)
				counts["delivered"]++
			}
		}
		fzCheck(t, "deliver", o.PrgEzpDeliver, b, ret, want)
	})
	t.Logf("%d frames through each of the 4 host programs: %v", runs, counts)
	if counts["tagged"] == 0 || counts["delivered"] == 0 {
		t.Fatalf("the generator misses a path: %v", counts)
	}
}

func TestFuzzToR(t *testing.T) {
	o := torForTest(t, 0)
	// Tenants: (port 1, VID 100) -> VNI 4096, (1, 101) -> 4097. Offloaded destinations of 4096:
	// ipB via tor2 (routed), .2.3 via a VTEP without a route; of 4097: ipB via h2 (routed). Decap
	// at this VTEP: (4096, ipA) and (4097, ipA).
	must(t, o.EzpVlanToVni.Put(torEzpPortVid{Ifindex: 1, Vid: testVID + 1}, uint32(testVNI+1)))
	must(t, o.EzpVlanToVni.Put(torEzpPortVid{Ifindex: 2, Vid: 7}, uint32(5))) // another port
	type encap struct{ vtep, vni uint32 }
	encaps := map[[2]uint32]encap{
		{testVNI, nbo(ipB)}:      {nbo(tor2), testVNI},
		{testVNI, nbo(fzIPs[2])}: {nbo(netip.MustParseAddr("198.18.9.9")), testVNI},
		{testVNI + 1, nbo(ipB)}:  {nbo(h2), testVNI + 1},
	}
	for k, v := range encaps {
		must(t, o.EzpEncap.Put(torEzpEncapKey{Vni: k[0], Dst: k[1]}, torEzpEncapVal{RemoteVtep: v.vtep, Vni: v.vni}))
	}
	routes := map[uint32]torEzpNexthop{
		nbo(tor2): {Ifindex: 1, Smac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 0, 254}), Dmac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 0, 253})},
		nbo(h2):   {Ifindex: 1, Smac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 1, 254}), Dmac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 0, 2})},
	}
	must(t, o.EzpIpv4Lpm.Put(torEzpLpmKey{Prefixlen: 32, Addr: nbo(h2)}, routes[nbo(h2)]))
	decaps := map[[2]uint32]bool{{testVNI, nbo(ipA)}: true, {testVNI + 1, nbo(ipA)}: true}
	for k := range decaps {
		must(t, o.EzpDecap.Put(torEzpDecapKey{Vtep: nbo(tor1), Vni: k[0], Dst: k[1]}, torEzpDecapVal{Ifindex: 1, Vid: testVID}))
	}
	vnis := map[int]uint32{testVID: testVNI, testVID + 1: testVNI + 1}
	ports := []uint16{4789}
	type reg struct{ bytes, packets, offloaded uint64 }
	flows := map[torEzpFlowKey]*reg{}
	count := func(vni uint32, h flow.Hdrs, n int, off bool) {
		k := torEzpFlowKey{Vni: vni}
		k.Flow.Saddr, k.Flow.Daddr, k.Flow.Proto = h.Key.Src, h.Key.Dst, h.Key.Proto
		k.Flow.Sport, k.Flow.Dport = h.Key.WirePorts()
		r := flows[k]
		if r == nil {
			r = &reg{}
			flows[k] = r
		}
		r.bytes += uint64(n)
		r.packets++
		if off {
			r.offloaded++
		}
		var v torEzpFlowVal
		if err := o.EzpFlowBytes.Lookup(k, &v); err != nil {
			t.Fatalf("flow %+v not in the register: %v", k, err)
		}
		if v.Bytes != r.bytes || v.Packets != r.packets || v.OffloadedPackets != r.offloaded {
			t.Errorf("register of %+v: %+v, model %+v", k, v, *r)
		}
	}
	rng := rand.New(rand.NewPCG(91, 92))
	counts := map[string]int{}
	runs := frames.Each(t.Failed, frames.FuzzCount(10000), 2048, func() []byte { return fzFrame(rng) }, func(b []byte) {
		if len(flows) > 8000 { // the register is an LRU of 16384: start over before it evicts
			var k torEzpFlowKey
			var v torEzpFlowVal
			var keys []torEzpFlowKey
			for it := o.EzpFlowBytes.Iterate(); it.Next(&k, &v); {
				keys = append(keys, k)
			}
			for _, k := range keys {
				_ = o.EzpFlowBytes.Delete(k)
			}
			clear(flows)
		}
		// prg_ezp_tor_dn (host-facing port).
		ret, want := verdictNext, b
		var counted func()
		if vid := fzVID(b); vid < 0 {
			if off, vni, r := flow.VXLANOuter(b, ports); r == flow.OK {
				if h, r := flow.ParseFrame(b, off, 0); r == flow.OK {
					counted = func() { count(vni, h, len(b)-off, false) }
					counts["transit"]++
				}
			}
		} else if vni, ok := vnis[vid]; !ok {
			ret = verdictShot
		} else if u, ok := fzPop(b); !ok {
			ret, want = verdictShot, u
		} else {
			ret, want = verdictShot, u
			h, r := flow.ParseFrame(u, 0, 0)
			if r == flow.OK && h.Family == 4 {
				if e, ok := encaps[[2]uint32{vni, h.Key.Dst[0]}]; ok {
					counted = func() { count(vni, h, len(u), true) }
					if nh, ok := routes[e.vtep]; ok {
						ret, want = verdictRedirect, fzEncap(u, e.vtep, e.vni, nh, h.Key.Hash())
						counts["encap"]++
					}
				}
			}
		}
		ret2, out := runProg(t, o.PrgEzpTorDn, append([]byte{}, b...))
		if ret2 != ret || !bytes.Equal(out, want) {
			t.Errorf("tor_dn: verdict %d, model %d; frame as the model %v\n in % x\nout % x\nwant % x", int32(ret2), int32(ret), bytes.Equal(out, want), b, out, want)
		}
		if counted != nil {
			counted()
		}
		// prg_ezp_tor_up (underlay port): VXLAN to this VTEP of a known (VNI, inner IPv4 dst) is
		// decapsulated (tag in metadata); any other VXLAN to this VTEP dropped; the rest routed.
		ret, want = verdictNext, b
		if h, r := flow.ParseFrame(b, 0, 0); r == flow.OK && h.Family == 4 && h.Key.Dst[0] == nbo(tor1) {
			if off, vni, r := flow.VXLANOf(b, h, ports); r == flow.OK {
				ret = verdictShot
				if ih, r := flow.ParseFrame(b, off, 0); r == flow.OK && ih.Family == 4 && decaps[[2]uint32{vni, ih.Key.Dst[0]}] && off == 50 {
					ret, want = verdictRedirect, b[off:]
					counts["decap"]++
				}
			}
		}
		fzCheck(t, "tor_up", o.PrgEzpTorUp, b, ret, want)
	})
	t.Logf("%d frames through each ToR program: %v", runs, counts)
	if counts["encap"] == 0 || counts["decap"] == 0 || counts["transit"] == 0 {
		t.Fatalf("the generator misses a path: %v", counts)
	}
}

// fzEncap is the frame prg_ezp_tor_dn makes of the untagged inner frame u: outer Ethernet of the
// route, IPv4 from this ToR's VTEP (TTL 64, id 0), UDP from a port of the inner flow's hash to
// 4789 (checksum 0), VXLAN with the I flag and the tenant's VNI.
func fzEncap(u []byte, vtep, vni uint32, nh torEzpNexthop, hash uint32) []byte {
	o := make([]byte, 50, 50+len(u))
	copy(o[0:], nh.Dmac[:])
	copy(o[6:], nh.Smac[:])
	o[12], o[13] = 0x08, 0x00
	ip := o[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(u)+36))
	binary.LittleEndian.PutUint32(ip[12:], nbo(tor1))
	binary.LittleEndian.PutUint32(ip[16:], vtep)
	binary.BigEndian.PutUint16(ip[10:], frames.Checksum(ip))
	binary.BigEndian.PutUint16(o[34:], uint16(49152|hash&0x3fff))
	binary.BigEndian.PutUint16(o[36:], 4789)
	binary.BigEndian.PutUint16(o[38:], uint16(len(u)+16))
	o[42] = 0x08
	binary.BigEndian.PutUint32(o[46:], vni<<8)
	return append(o, u...)
}
