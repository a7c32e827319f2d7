package ezpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// The programs run on crafted frames through BPF_PROG_TEST_RUN. A test run has no device behind
// it: skb->dev is the loopback (ifindex 1) and redirects only report their verdict. A tag the
// programs push lives in skb metadata, which a test run does not return, so pushes are checked
// through the counters and in the lab test (tcpdump on the host-ToR link).

var (
	tor1 = netip.MustParseAddr("198.18.0.254")
	tor2 = netip.MustParseAddr("198.18.0.253")
	h2   = netip.MustParseAddr("198.18.0.2")
)

const (
	testVNI = 4096
	testVID = 100
)

func runProg(t *testing.T, p *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

func torForTest(t *testing.T, tableSize int) *torObjects {
	t.Helper()
	o := testutil.LoadObjects(t, func() (*torObjects, error) { return newTorObjects(tableSize) })
	cfg := torEzpTorCfg{Vtep: nbo(tor1)}
	cfg.VxlanPorts[0] = 4789
	must(t, o.EzpTorCfg.Put(uint32(0), cfg))
	must(t, o.EzpVlanToVni.Put(torEzpPortVid{Ifindex: 1, Vid: testVID}, uint32(testVNI)))
	nh := torEzpNexthop{Ifindex: 1, Smac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 0, 254}), Dmac: mac6(net.HardwareAddr{0x12, 0x42, 198, 18, 0, 253})}
	must(t, o.EzpIpv4Lpm.Put(torEzpLpmKey{Prefixlen: 32, Addr: nbo(tor2)}, nh))
	return o
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// statOf is counter i of a per-CPU statistics map of n counters, summed over the CPUs.
func statOf(t *testing.T, m *ebpf.Map, n, i int) uint64 {
	t.Helper()
	s, err := sumPerCPU(m, n)
	must(t, err)
	return s[i]
}

func torStat(t *testing.T, o *torObjects, i int) uint64 { return statOf(t, o.PrgEzpTstat, torStatN, i) }

func TestToRDownEncapsulatesTaggedFrames(t *testing.T) {
	o := torForTest(t, 0)
	must(t, o.EzpEncap.Put(torEzpEncapKey{Vni: testVNI, Dst: nbo(ipB)}, torEzpEncapVal{RemoteVtep: nbo(tor2), Vni: testVNI}))
	inner := innerFrame()
	ret, out := runProg(t, o.PrgEzpTorDn, frames.Tag(inner, testVID))
	if ret != verdictRedirect {
		t.Fatalf("verdict %d, want redirect", int32(ret))
	}
	if len(out) != 14+50+len(inner)-14 {
		t.Fatalf("encapsulated length %d, want %d", len(out), 14+50+len(inner)-14)
	}
	if !bytes.Equal(out[0:6], []byte{0x12, 0x42, 198, 18, 0, 253}) || binary.BigEndian.Uint16(out[12:]) != 0x0800 {
		t.Fatalf("outer Ethernet wrong: % x", out[:14])
	}
	ip := out[14:34]
	if frames.Checksum(ip) != 0 || ip[9] != 17 || netip.AddrFrom4([4]byte(ip[12:16])) != tor1 || netip.AddrFrom4([4]byte(ip[16:20])) != tor2 {
		t.Fatalf("outer IPv4 wrong (checksum, proto, VTEPs): % x", ip)
	}
	if int(binary.BigEndian.Uint16(ip[2:])) != len(out)-14 {
		t.Fatalf("outer total length %d, frame carries %d", binary.BigEndian.Uint16(ip[2:]), len(out)-14)
	}
	udp := out[34:42]
	if binary.BigEndian.Uint16(udp[2:]) != 4789 || binary.BigEndian.Uint16(udp[0:]) < 49152 {
		t.Fatalf("outer UDP wrong: % x", udp)
	}
	if out[42] != 0x08 || binary.BigEndian.Uint32(out[46:])>>8 != testVNI {
		t.Fatalf("VXLAN header wrong: % x", out[42:50])
	}
	if !bytes.Equal(out[50:], inner) {
		t.Fatal("the inner frame must follow untagged and unchanged")
	}
	if torStat(t, o, torEncap) != 1 {
		t.Fatal("encap counter not 1")
	}
	// The flow was counted as offloaded traffic of tenant VNI.
	flows, err := readFlowTable(o.EzpFlowBytes)
	must(t, err)
	if len(flows) != 1 || flows[0].Key.VNI != testVNI || flows[0].Key.Dst != ipB || flows[0].OffloadedPackets != 1 {
		t.Fatalf("flow register: %+v", flows)
	}
}

func TestToRDownMissesLeaveOrDrop(t *testing.T) {
	o := torForTest(t, 0)
	inner := innerFrame()
	// Tagged, tenant known, destination not offloaded: nothing else may take a tagged frame.
	if ret, _ := runProg(t, o.PrgEzpTorDn, frames.Tag(inner, testVID)); ret != verdictShot || torStat(t, o, torMissEncap) != 1 {
		t.Fatalf("encap miss: verdict %d", int32(ret))
	}
	// Unknown VID.
	if ret, _ := runProg(t, o.PrgEzpTorDn, frames.Tag(inner, 7)); ret != verdictShot || torStat(t, o, torMissVNI) != 1 {
		t.Fatalf("VID miss: verdict %d", int32(ret))
	}
	// Untagged overlay VXLAN from the host VTEP: counted, then left to the kernel unchanged.
	vx := vxlanFrame(inner, netip.MustParseAddr("198.18.0.1"), h2, testVNI, 4789)
	ret, out := runProg(t, o.PrgEzpTorDn, vx)
	if ret != verdictNext || !bytes.Equal(out, vx) || torStat(t, o, torTransit) != 1 {
		t.Fatalf("transit VXLAN: verdict %d, changed %v", int32(ret), !bytes.Equal(out, vx))
	}
	flows, err := readFlowTable(o.EzpFlowBytes)
	must(t, err)
	if len(flows) != 1 || flows[0].Key.Src != ipA || flows[0].Key.SPort != 40000 || flows[0].OffloadedPackets != 0 {
		t.Fatalf("transit flow register: %+v", flows)
	}
	// Plain IP and ARP: unchanged.
	arp := frames.EthMAC(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA, 0x0806, make([]byte, 28))
	for _, f := range [][]byte{inner, arp} {
		if ret, out := runProg(t, o.PrgEzpTorDn, f); ret != verdictNext || !bytes.Equal(out, f) {
			t.Fatalf("plain frame: verdict %d", int32(ret))
		}
	}
}

func TestToRUpDecapsulatesToItsHosts(t *testing.T) {
	o := torForTest(t, 0)
	must(t, o.EzpDecap.Put(torEzpDecapKey{Vtep: nbo(tor1), Vni: testVNI, Dst: nbo(ipB)}, torEzpDecapVal{Ifindex: 1, Vid: testVID}))
	inner := innerFrame()
	ret, out := runProg(t, o.PrgEzpTorUp, vxlanFrame(inner, tor2, tor1, testVNI, 4789))
	if ret != verdictRedirect || !bytes.Equal(out, inner) || torStat(t, o, torDecap) != 1 {
		t.Fatalf("decap: verdict %d, inner restored %v", int32(ret), bytes.Equal(out, inner))
	}
	// To our VTEP, unknown destination: dropped.
	other := tcpFrame(frames.Addr("198.19.9.9"), 1, 2, 10)
	if ret, _ := runProg(t, o.PrgEzpTorUp, vxlanFrame(other, tor2, tor1, testVNI, 4789)); ret != verdictShot || torStat(t, o, torMissDecap) != 1 {
		t.Fatalf("decap miss: verdict %d", int32(ret))
	}
	// To a host VTEP (the overlay, or a one-sided offload): routed by the kernel, unchanged.
	vx := vxlanFrame(inner, tor2, h2, testVNI, 4789)
	if ret, out := runProg(t, o.PrgEzpTorUp, vx); ret != verdictNext || !bytes.Equal(out, vx) {
		t.Fatalf("host VTEP: verdict %d", int32(ret))
	}
}

func TestToRTableFullRefusesNewEntries(t *testing.T) {
	o := torForTest(t, 1)
	must(t, o.EzpEncap.Put(torEzpEncapKey{Vni: testVNI, Dst: nbo(ipB)}, torEzpEncapVal{RemoteVtep: nbo(tor2), Vni: testVNI}))
	err := o.EzpEncap.Update(torEzpEncapKey{Vni: testVNI, Dst: nbo(ipA)}, torEzpEncapVal{RemoteVtep: nbo(tor2), Vni: testVNI}, ebpf.UpdateNoExist)
	if !isTableFull(err) {
		t.Fatalf("a second entry in a 1-entry table should be refused as full, got %v", err)
	}
}

func hostForTest(t *testing.T) *hostObjects {
	t.Helper()
	o := testutil.LoadObjects(t, newHostObjects)
	must(t, o.EzpHostCfg.Put(uint32(0), hostEzpHostCfg{Uplink: 1, RelayHost: 1, RelayOv: 1}))
	return o
}

func hostStat(t *testing.T, o *hostObjects, i int) uint64 {
	return statOf(t, o.PrgEzpHstat, hostStatN, i)
}

func TestHostPortTagsOffloadedFlowsOnly(t *testing.T) {
	o := hostForTest(t)
	inner := innerFrame()
	if ret, out := runProg(t, o.PrgEzpPort, inner); ret != verdictNext || !bytes.Equal(out, inner) {
		t.Fatalf("not offloaded: verdict %d", int32(ret))
	}
	must(t, o.EzpHostEgress.Put(hostEzpEgressKey{Ifindex: 1, Dst: nbo(ipB)}, hostEzpEgressVal{Vid: testVID}))
	if ret, _ := runProg(t, o.PrgEzpPort, inner); ret != verdictRedirect || hostStat(t, o, hostTagged) != 1 {
		t.Fatalf("offloaded: verdict %d, tagged %d", int32(ret), hostStat(t, o, hostTagged))
	}
	arp := frames.EthMAC(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA, 0x0806, make([]byte, 28))
	if ret, out := runProg(t, o.PrgEzpPort, arp); ret != verdictNext || !bytes.Equal(out, arp) {
		t.Fatalf("ARP must stay on the overlay: verdict %d", int32(ret))
	}
}

func TestHostUplinkAndRelayPassOnlyTaggedFrames(t *testing.T) {
	o := hostForTest(t)
	inner := innerFrame()
	if ret, out := runProg(t, o.PrgEzpUplink, inner); ret != verdictNext || !bytes.Equal(out, inner) {
		t.Fatalf("uplink, untagged: verdict %d", int32(ret))
	}
	if ret, _ := runProg(t, o.PrgEzpUplink, frames.Tag(inner, testVID)); ret != verdictRedirect {
		t.Fatalf("uplink, tagged: verdict %d", int32(ret))
	}
	if ret, _ := runProg(t, o.PrgEzpRelay, frames.Tag(inner, testVID)); ret != verdictRedirect || hostStat(t, o, hostRelayed) != 1 {
		t.Fatalf("relay, tagged: verdict %d", int32(ret))
	}
	if ret, _ := runProg(t, o.PrgEzpRelay, inner); ret != verdictShot {
		t.Fatalf("relay, untagged: verdict %d", int32(ret))
	}
}

func TestHostDeliverUntagsIntoThePod(t *testing.T) {
	o := hostForTest(t)
	const domain = 77
	must(t, o.EzpHostVid.Put(uint32(testVID), hostEzpVidVal{Domain: domain}))
	tb := endpoints.Tables{EP: o.PrgEzpEp, Port: o.PrgEzpPodport}
	ctr := net.HardwareAddr{0x02, 0x42, 0, 0, 0, 9}
	_, err := endpoints.Sync(tb, []endpoints.Endpoint{{Domain: domain, Addr: ipB, Netns: "", Veth: "lo", Ifindex: 1, CtrMAC: ctr, BrMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}, timeNow())
	must(t, err)
	inner := innerFrame()
	ret, out := runProg(t, o.PrgEzpDeliver, frames.Tag(inner, testVID))
	if ret != verdictRedirect || hostStat(t, o, hostDelivered) != 1 {
		t.Fatalf("deliver: verdict %d, counters %d", int32(ret), hostStat(t, o, hostDelivered))
	}
	if !bytes.Equal(out[0:6], ctr) || !bytes.Equal(out[6:12], macA) || !bytes.Equal(out[12:], inner[12:]) {
		t.Fatalf("delivered frame should be untagged with the pod's MAC: % x", out[:18])
	}
	if ret, _ := runProg(t, o.PrgEzpDeliver, frames.Tag(inner, 5)); ret != verdictShot || hostStat(t, o, hostMissVID) != 1 {
		t.Fatalf("unknown VID: verdict %d", int32(ret))
	}
	if ret, _ := runProg(t, o.PrgEzpDeliver, inner); ret != verdictShot {
		t.Fatalf("untagged frame at the deliver port: verdict %d", int32(ret))
	}
}

// A pod's own word never decides where a tagged frame goes (issue 28, rule b): an address two
// pods claim has no entry (endpoints.Sync refuses both), and a frame for it, or for an address no
// pod has, enters the overlay's normal path at the tenant's VXLAN device (whose bridge delivers
// it by what it learned) instead of being dropped.
func TestHostDeliverRefusedAddressTakesTheOverlay(t *testing.T) {
	o := hostForTest(t)
	const domain = 77
	tb := endpoints.Tables{EP: o.PrgEzpEp, Port: o.PrgEzpPodport}
	ctr := net.HardwareAddr{0x02, 0x42, 0, 0, 0, 9}
	claim := func(mac net.HardwareAddr, veth string) endpoints.Endpoint {
		return endpoints.Endpoint{Domain: domain, Addr: ipB, Netns: "", Veth: veth, Ifindex: 1, CtrMAC: mac, BrMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}
	}
	rep, err := endpoints.Sync(tb, []endpoints.Endpoint{claim(ctr, "lo"), claim(net.HardwareAddr{0x02, 0x42, 0, 0, 0, 0xb}, "lo-hijacker")}, timeNow())
	must(t, err)
	if len(rep.Conflicts) != 1 {
		t.Fatalf("conflicts %+v", rep.Conflicts)
	}
	inner := innerFrame()
	must(t, o.EzpHostVid.Put(uint32(testVID), hostEzpVidVal{Domain: domain}))
	if ret, _ := runProg(t, o.PrgEzpDeliver, frames.Tag(inner, testVID)); ret != verdictShot || hostStat(t, o, hostMissPod) != 1 {
		t.Fatalf("no VXLAN device known: verdict %d", int32(ret))
	}
	must(t, o.EzpHostVid.Put(uint32(testVID), hostEzpVidVal{Domain: domain, Vx: 1}))
	ret, out := runProg(t, o.PrgEzpDeliver, frames.Tag(inner, testVID))
	if ret != verdictRedirect || hostStat(t, o, hostToOverlay) != 1 || hostStat(t, o, hostDelivered) != 0 {
		t.Fatalf("refused address: verdict %d, to_overlay %d, delivered %d", int32(ret), hostStat(t, o, hostToOverlay), hostStat(t, o, hostDelivered))
	}
	if !bytes.Equal(out, inner) {
		t.Fatalf("the overlay should get the inner frame as sent (untagged, its MACs kept): % x", out[:18])
	}
}

// The gate (issue 28, rule a): an offloaded frame goes straight to its pod only while the
// overlay's normal path delivered its flow to that pod, through the same veth, within the
// window; otherwise it takes the normal path (the tenant's VXLAN device), tagged so that the
// pod's prg_ezp_dlv records the delivery. An untagged frame at the pod is never recorded.
func TestHostDeliverGate(t *testing.T) {
	o := hostForTest(t)
	must(t, o.EzpHostCfg.Put(uint32(0), hostEzpHostCfg{Uplink: 1, RelayHost: 1, RelayOv: 1, VerifyNs: uint64(gateVerify), WindowNs: uint64(gateWindow)}))
	const domain = 77
	must(t, o.EzpHostVid.Put(uint32(testVID), hostEzpVidVal{Domain: domain, Vx: 1}))
	inner := innerFrame()
	ctr := net.HardwareAddr(inner[0:6]) // the pod's MAC: what the sender addressed
	tb := endpoints.Tables{EP: o.PrgEzpEp, Port: o.PrgEzpPodport}
	_, err := endpoints.Sync(tb, []endpoints.Endpoint{{Domain: domain, Addr: ipB, Netns: "", Veth: "lo", Ifindex: 1, CtrMAC: ctr, BrMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}, timeNow())
	must(t, err)
	ino, err := netnsutil.Inode("/proc/self/ns/net")
	must(t, err)
	podDev := func(hostIfindex uint32) {
		must(t, o.PrgEzpPod.Put(hostPrgDevKey{Netns: uint32(ino), Ifindex: 1}, hostEzpPod{Domain: domain, Ifindex: hostIfindex}))
	}
	deliver := func(what string, counter int) {
		t.Helper()
		before, delivered := hostStat(t, o, counter), hostStat(t, o, hostDelivered)
		ret, out := runProg(t, o.PrgEzpDeliver, frames.Tag(inner, testVID))
		if ret != verdictRedirect || hostStat(t, o, counter) != before+1 {
			t.Fatalf("%s: verdict %d, counter %d -> %d", what, int32(ret), before, hostStat(t, o, counter))
		}
		if counter != hostDelivered && (hostStat(t, o, hostDelivered) != delivered || !bytes.Equal(out, inner)) {
			t.Fatalf("%s: the frame went to the pod, not to the overlay unchanged", what)
		}
	}
	deliver("never delivered by the normal path", hostGateUnseen)
	if ret, _ := runProg(t, o.PrgEzpDlv, inner); ret != verdictNext || hostStat(t, o, hostDlvNoPod)+hostStat(t, o, hostDlv) != 0 {
		t.Fatalf("an untagged frame at the pod: verdict %d, recorded", int32(ret))
	}
	runProg(t, o.PrgEzpDlvt, inner)
	if hostStat(t, o, hostDlvNoPod) != 1 {
		t.Fatal("a device attach did not describe was recorded")
	}
	podDev(1)
	runProg(t, o.PrgEzpDlvt, inner)
	if hostStat(t, o, hostDlv) != 1 {
		t.Fatal("the normal path's delivery was not recorded")
	}
	deliver("delivered by the normal path just now", hostDelivered)
	podDev(41) // the normal path delivers the flow through another veth than the table's
	runProg(t, o.PrgEzpDlvt, inner)
	deliver("delivered through another veth", hostGateElsewhere)
}
