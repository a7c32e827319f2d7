package fastpath

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// psock is an AF_PACKET socket on one device of a namespace.
type psock struct {
	fd      int
	ifindex int
}

func openPsock(t *testing.T, ns, dev string, vnet bool) *psock {
	t.Helper()
	s := &psock{}
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		s.ifindex = l.Attrs().Index
		s.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if vnet {
			if err := unix.SetsockoptInt(s.fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
				return err
			}
		}
		tv := unix.Timeval{Usec: 200000}
		if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(s.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: s.ifindex})
	})
	if err != nil {
		t.Fatalf("packet socket on %s/%s: %v", ns, dev, err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

func (s *psock) send(t *testing.T, frame []byte) {
	t.Helper()
	if err := unix.Sendto(s.fd, frame, 0, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: s.ifindex}); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// collect reads frames for d that match keep (outgoing ones if out, else incoming).
func (s *psock) collect(d time.Duration, out bool, keep func([]byte) bool) [][]byte {
	var got [][]byte
	buf := make([]byte, 70000)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			continue
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || (ll.Pkttype == unix.PACKET_OUTGOING) != out {
			continue
		}
		if keep(buf[:n]) {
			got = append(got, append([]byte{}, buf[:n]...))
		}
	}
	return got
}

// innerIs matches a VXLAN frame (on the underlay) or a plain frame (in a pod) carrying the
// IPv4 packet src:sport -> dst:dport of protocol proto.
func innerIs(vxlan bool, proto uint8, src, dst netip.Addr, sport, dport uint16) func([]byte) bool {
	return func(b []byte) bool {
		off := 14
		if vxlan {
			if len(b) < 64 || binary.BigEndian.Uint16(b[36:]) != 8472 {
				return false
			}
			off = 64
		}
		if len(b) < off+24 || binary.BigEndian.Uint16(b[off-2:]) != 0x0800 || b[off+9] != proto {
			return false
		}
		if proto == 6 && (len(b) < off+34 || b[off+33]&0x04 != 0) {
			return false // the pods' stacks answer our made-up segments with resets: not ours
		}
		s, d := netip.AddrFrom4([4]byte(b[off+12:off+16])), netip.AddrFrom4([4]byte(b[off+16:off+20]))
		return s == src && d == dst && binary.BigEndian.Uint16(b[off+20:]) == sport && binary.BigEndian.Uint16(b[off+22:]) == dport
	}
}

// sameButID compares two frames built by the VXLAN device and by the fast path: equal except
// the outer IPv4 ID (fresh per packet) with the header checksum that covers it, and the outer
// UDP checksum (the device computes one, the fast path sends 0, which it must).
func sameButID(t *testing.T, what string, kernel, fast []byte) {
	t.Helper()
	if len(kernel) != len(fast) {
		t.Fatalf("%s: kernel built %d bytes, fast path %d", what, len(kernel), len(fast))
	}
	k, f := append([]byte{}, kernel...), append([]byte{}, fast...)
	if csum(f[14:34], 0) != 0 {
		t.Fatalf("%s: fast path's outer IPv4 checksum is wrong", what)
	}
	if binary.BigEndian.Uint16(f[40:]) != 0 {
		t.Fatalf("%s: fast path's outer UDP checksum %x, want 0", what, f[40:42])
	}
	for _, r := range [][2]int{{18, 20}, {24, 26}, {40, 42}} {
		copy(k[r[0]:r[1]], make([]byte, 2))
		copy(f[r[0]:r[1]], make([]byte, 2))
	}
	if !bytes.Equal(k, f) {
		for i := range k {
			if k[i] != f[i] {
				t.Fatalf("%s: first difference at byte %d: kernel %x, fast path %x\nkernel %x\nfast   %x", what, i, k[i], f[i], kernel[:min(len(k), 96)], fast[:min(len(f), 96)])
			}
		}
	}
}

func linkMAC(t *testing.T, ns, dev string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// vnetFrame prepends a virtio_net_hdr that makes the frame a TCP GSO super-packet with a
// partial checksum (the pseudo-header sum is in the TCP checksum field, as the stack leaves it).
func vnetFrame(fr []byte, mss uint16) []byte {
	b := append([]byte{}, fr...)
	tcp := b[34:]
	var ph uint32
	for _, w := range [][]byte{b[26:28], b[28:30], b[30:32], b[32:34]} {
		ph += uint32(binary.BigEndian.Uint16(w))
	}
	ph += 6 + uint32(len(tcp))
	for ph>>16 != 0 {
		ph = ph&0xffff + ph>>16
	}
	binary.BigEndian.PutUint16(tcp[16:], uint16(ph))
	h := make([]byte, 10)
	h[0] = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	h[1] = 1 // VIRTIO_NET_HDR_GSO_TCPV4
	binary.LittleEndian.PutUint16(h[2:], 54)
	binary.LittleEndian.PutUint16(h[4:], mss)
	binary.LittleEndian.PutUint16(h[6:], 34)
	binary.LittleEndian.PutUint16(h[8:], 16)
	return append(h, b...)
}

// TestWireSameAsKernel sends the same inner packets once over the kernel's overlay path and once
// over the fast path, in a flannel lab with the fast path attached, and compares what reached
// the wire (the underlay's transmit) and what reached the pod, byte for byte: TCP, UDP, and a
// TCP GSO super-packet (its segments on the wire).
func TestWireSameAsKernel(t *testing.T) {
	spec := lab.Spec{Name: "fpw", Style: lab.StyleFlannel, Containers: 1}
	l := labForTest(t, spec)
	h1, h2, c1, c2 := l.Hosts[0].Netns, l.Hosts[1].Netns, l.Containers[0], l.Containers[1]
	for _, h := range []string{h1, h2} {
		if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{Extra: map[string]string{OptAgent: "off"}}); err != nil {
			t.Fatal(err)
		}
	}
	a1 := netip.MustParsePrefix(c1.Addr).Addr()
	a2 := netip.MustParsePrefix(c2.Addr).Addr()
	mac1, mac2 := linkMAC(t, c1.Netns, "eth0"), linkMAC(t, c2.Netns, "eth0")
	br1, br2 := linkMAC(t, h1, "cni0"), linkMAC(t, h2, "cni0")
	wire1, wire2 := openPsock(t, h1, "eth0", false), openPsock(t, h2, "eth0", false)
	pod1, pod2 := openPsock(t, c1.Netns, "eth0", false), openPsock(t, c2.Netns, "eth0", false)
	gso1 := openPsock(t, c1.Netns, "eth0", true)

	one := func(t *testing.T, s *psock, pkts [][]byte, what string) []byte {
		t.Helper()
		if len(pkts) != 1 {
			t.Fatalf("%s: captured %d frames, want 1", what, len(pkts))
		}
		return pkts[0]
	}
	egressHits := func(h string) uint64 { e, _ := hits(t, h); return e }
	ingressHits := func(h string) uint64 { _, i := hits(t, h); return i }

	for _, c := range []struct {
		name  string
		proto uint8
	}{{"tcp", 6}, {"udp", 17}} {
		t.Run(c.name, func(t *testing.T) {
			sp, dp := uint16(41000+uint16(c.proto)), uint16(7000+uint16(c.proto))
			fwd := frame{dst: br1, src: mac1, saddr: a1, daddr: a2, proto: c.proto, sport: sp, dport: dp, tcpFlags: 0x18, payload: bytes.Repeat([]byte{0xab}, 300)}
			rev := frame{dst: br2, src: mac2, saddr: a2, daddr: a1, proto: c.proto, sport: dp, dport: sp, tcpFlags: 0x18, payload: bytes.Repeat([]byte{0xcd}, 200)}
			matchFwd := innerIs(true, c.proto, a1, a2, sp, dp)
			matchRev := innerIs(true, c.proto, a2, a1, dp, sp)
			atPod1 := innerIs(false, c.proto, a2, a1, dp, sp)

			// First round: nothing learned, the kernel carries both directions (and teaches).
			pod1.send(t, fwd.bytes())
			kFwd := one(t, wire1, wire1.collect(300*time.Millisecond, true, matchFwd), "kernel forward")
			pod2.send(t, rev.bytes())
			kRev := one(t, wire2, wire2.collect(300*time.Millisecond, true, matchRev), "kernel reverse")
			kPod := one(t, pod1, pod1.collect(300*time.Millisecond, false, atPod1), "kernel delivery")
			// Second round: learned both ways on both hosts, the fast path carries them.
			e1, i1 := egressHits(h1), ingressHits(h1)
			pod1.send(t, fwd.bytes())
			fFwd := one(t, wire1, wire1.collect(300*time.Millisecond, true, matchFwd), "fast forward")
			pod2.send(t, rev.bytes())
			fRev := one(t, wire2, wire2.collect(300*time.Millisecond, true, matchRev), "fast reverse")
			fPod := one(t, pod1, pod1.collect(300*time.Millisecond, false, atPod1), "fast delivery")
			if egressHits(h1) != e1+1 || ingressHits(h1) != i1+1 {
				t.Fatalf("second round did not take the fast path (h1 egress hits %d -> %d, ingress %d -> %d)", e1, egressHits(h1), i1, ingressHits(h1))
			}
			sameButID(t, "encapsulation h1", kFwd, fFwd)
			sameButID(t, "encapsulation h2", kRev, fRev)
			if !bytes.Equal(kPod, fPod) {
				t.Fatalf("decapsulated delivery differs:\nkernel %x\nfast   %x", kPod, fPod)
			}
		})
	}

	t.Run("tcp gso", func(t *testing.T) {
		sp, dp := uint16(42000), uint16(7100)
		fwd := frame{dst: br1, src: mac1, saddr: a1, daddr: a2, proto: 6, sport: sp, dport: dp, tcpFlags: 0x10, payload: bytes.Repeat([]byte{0x5a}, 3*1398+100)}
		rev := frame{dst: br2, src: mac2, saddr: a2, daddr: a1, proto: 6, sport: dp, dport: sp, tcpFlags: 0x10, payload: make([]byte, 10)}
		matchFwd := innerIs(true, 6, a1, a2, sp, dp)
		gso1.send(t, vnetFrame(fwd.bytes(), 1398))
		kSegs := wire1.collect(400*time.Millisecond, true, matchFwd)
		pod2.send(t, rev.bytes())
		time.Sleep(100 * time.Millisecond)
		e1 := egressHits(h1)
		gso1.send(t, vnetFrame(fwd.bytes(), 1398))
		fSegs := wire1.collect(400*time.Millisecond, true, matchFwd)
		if egressHits(h1) != e1+1 {
			t.Fatalf("the super-packet did not take the fast path")
		}
		if len(kSegs) != 4 || len(fSegs) != len(kSegs) {
			t.Fatalf("segments on the wire: kernel %d, fast path %d (want 4 each)", len(kSegs), len(fSegs))
		}
		for i := range kSegs {
			sameButID(t, fmt.Sprintf("segment %d", i), kSegs[i], fSegs[i])
		}
	})
}
