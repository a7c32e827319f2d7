package inject

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// decoded is what the test parser pulls out of a frame, independently of the builder's offsets
// (it walks the headers by their own length fields).
type decoded struct {
	outerDst, outerSrc                               MAC
	outerIP                                          ipv4
	outerSport, outerDport, outerUDPLen, outerUDPSum uint16
	vxFlags                                          byte
	vni                                              uint32
	innerDst, innerSrc                               MAC
	innerIP                                          ipv4
	innerSport, innerDport, innerUDPLen, innerUDPSum uint16
	payload                                          []byte
}

type ipv4 struct {
	src, dst   netip.Addr
	totalLen   uint16
	proto, ttl byte
	df         bool
}

func parseEth(b []byte) (dst, src MAC, rest []byte, err error) {
	if len(b) < 14 {
		return dst, src, nil, fmt.Errorf("ethernet: %d bytes", len(b))
	}
	copy(dst[:], b[0:6])
	copy(src[:], b[6:12])
	if et := binary.BigEndian.Uint16(b[12:14]); et != 0x0800 {
		return dst, src, nil, fmt.Errorf("ethertype %#x", et)
	}
	return dst, src, b[14:], nil
}

func parseIPv4(b []byte) (ipv4, []byte, error) {
	var h ipv4
	if len(b) < 20 || b[0]>>4 != 4 {
		return h, nil, fmt.Errorf("not IPv4")
	}
	ihl := int(b[0]&0xf) * 4
	if Checksum(b[:ihl]) != 0 {
		return h, nil, fmt.Errorf("bad IPv4 header checksum %#04x", binary.BigEndian.Uint16(b[10:12]))
	}
	h.totalLen = binary.BigEndian.Uint16(b[2:4])
	if int(h.totalLen) != len(b) {
		return h, nil, fmt.Errorf("IPv4 total length %d, have %d bytes", h.totalLen, len(b))
	}
	h.df = binary.BigEndian.Uint16(b[6:8])&0x4000 != 0
	h.ttl, h.proto = b[8], b[9]
	h.src = netip.AddrFrom4([4]byte(b[12:16]))
	h.dst = netip.AddrFrom4([4]byte(b[16:20]))
	return h, b[ihl:], nil
}

func parseUDP(b []byte) (sport, dport, length, sum uint16, rest []byte, err error) {
	if len(b) < 8 {
		return 0, 0, 0, 0, nil, fmt.Errorf("udp: %d bytes", len(b))
	}
	length = binary.BigEndian.Uint16(b[4:6])
	if int(length) != len(b) {
		return 0, 0, 0, 0, nil, fmt.Errorf("UDP length %d, have %d bytes", length, len(b))
	}
	return binary.BigEndian.Uint16(b[0:2]), binary.BigEndian.Uint16(b[2:4]), length, binary.BigEndian.Uint16(b[6:8]), b[8:], nil
}

func decode(f []byte) (d decoded, err error) {
	var b []byte
	if d.outerDst, d.outerSrc, b, err = parseEth(f); err != nil {
		return d, err
	}
	if d.outerIP, b, err = parseIPv4(b); err != nil {
		return d, fmt.Errorf("outer: %w", err)
	}
	if d.outerSport, d.outerDport, d.outerUDPLen, d.outerUDPSum, b, err = parseUDP(b); err != nil {
		return d, fmt.Errorf("outer: %w", err)
	}
	if len(b) < 8 {
		return d, fmt.Errorf("vxlan: %d bytes", len(b))
	}
	d.vxFlags = b[0]
	if b[1]|b[2]|b[3]|b[7] != 0 {
		return d, fmt.Errorf("vxlan reserved bits set: % x", b[:8])
	}
	d.vni = binary.BigEndian.Uint32(b[4:8]) >> 8
	if d.innerDst, d.innerSrc, b, err = parseEth(b[8:]); err != nil {
		return d, fmt.Errorf("inner: %w", err)
	}
	if d.innerIP, b, err = parseIPv4(b); err != nil {
		return d, fmt.Errorf("inner: %w", err)
	}
	if d.innerSport, d.innerDport, d.innerUDPLen, d.innerUDPSum, d.payload, err = parseUDP(b); err != nil {
		return d, fmt.Errorf("inner: %w", err)
	}
	return d, nil
}

func testConfig(t *testing.T, mod func(*Config)) Config {
	t.Helper()
	c := Config{
		Device:       "eth0",
		SrcMAC:       MustMAC("02:00:00:00:00:01"),
		DstMAC:       MustMAC("02:00:00:00:00:02"),
		SrcIP:        netip.MustParseAddr("198.18.252.1"),
		DstIP:        netip.MustParseAddr("198.18.252.2"),
		VNI:          0xabcdef,
		InnerDstMAC:  MustMAC("02:00:00:00:01:02"),
		InnerSrcIP:   netip.MustParseAddr("198.19.252.1"),
		InnerDstIP:   netip.MustParseAddr("198.19.252.2"),
		InnerDstPort: 5001,
		Count:        1,
	}
	if mod != nil {
		mod(&c)
	}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBuildFrameFields(t *testing.T) {
	for _, size := range []int{PayloadMin, 64, 1000, PayloadMax} {
		for _, port := range []uint16{PortIANA, PortFlannel} {
			c := testConfig(t, func(c *Config) { c.PayloadSize, c.DstPort, c.Flows = size, port, 8 })
			for flow := range c.Flows {
				f := BuildFrame(c, flow)
				if len(f) != c.FrameLen() || c.Headroom() != HeadroomVXLAN || len(f) != 92+size {
					t.Fatalf("frame length %d, want %d", len(f), 92+size)
				}
				d, err := decode(f)
				if err != nil {
					t.Fatalf("size %d flow %d: %v", size, flow, err)
				}
				check := func(what string, got, want any) {
					t.Helper()
					if got != want {
						t.Errorf("size %d flow %d: %s = %v, want %v", size, flow, what, got, want)
					}
				}
				check("outer dst mac", d.outerDst, c.DstMAC)
				check("outer src mac", d.outerSrc, c.SrcMAC)
				check("outer src ip", d.outerIP.src, c.SrcIP)
				check("outer dst ip", d.outerIP.dst, c.DstIP)
				check("outer proto", d.outerIP.proto, byte(17))
				check("outer ttl", d.outerIP.ttl, byte(64))
				check("outer DF", d.outerIP.df, true)
				check("outer ip len", int(d.outerIP.totalLen), len(f)-14)
				check("outer udp len", int(d.outerUDPLen), len(f)-34)
				check("outer dport", d.outerDport, port)
				check("outer sport", d.outerSport, OuterSrcPortOf(c, flow))
				check("outer udp csum", d.outerUDPSum, uint16(0))
				check("vxlan flags", d.vxFlags, byte(0x08))
				check("vni", d.vni, c.VNI)
				check("inner dst mac", d.innerDst, c.InnerDstMAC)
				check("inner src mac", d.innerSrc, MAC{0x02, 0x42, 198, 19, 252, 1})
				check("inner src ip", d.innerIP.src, c.InnerSrcIP)
				check("inner dst ip", d.innerIP.dst, c.InnerDstIP)
				check("inner ip len", int(d.innerIP.totalLen), 28+size)
				check("inner sport", d.innerSport, uint16(10000+flow))
				check("inner dport", d.innerDport, uint16(5001))
				check("inner udp len", int(d.innerUDPLen), 8+size)
				check("inner udp csum", d.innerUDPSum, uint16(0))
				check("payload len", len(d.payload), size)

				// The builder's offsets agree with the parser's walk.
				check("payload offset", len(f)-len(d.payload), OffPayload)
				check("vni at offset", binary.BigEndian.Uint32(f[OffVXLAN+4:])>>8, c.VNI)
				check("inner sport at offset", binary.BigEndian.Uint16(f[OffInnerUDP:]), uint16(10000+flow))

				seq, fl, ok := ParsePayload(d.payload)
				check("payload ok", ok, true)
				check("payload seq", seq, uint64(0))
				check("payload flow", fl, uint32(flow))

				// Writing a sequence in place keeps every checksum valid.
				PutPayloadHeader(f[OffPayload:], 1<<40+7, uint32(flow))
				d2, err := decode(f)
				if err != nil {
					t.Fatalf("after seq write: %v", err)
				}
				seq, _, _ = ParsePayload(d2.payload)
				check("payload seq after write", seq, uint64(1<<40+7))
			}
		}
	}
}

// plainConfig is a plain-mode config with none of the VXLAN-only fields set: they are not required.
func plainConfig(t *testing.T, mod func(*Config)) Config {
	t.Helper()
	return testConfig(t, func(c *Config) {
		c.Plain = true
		c.VNI, c.InnerDstMAC, c.InnerSrcIP, c.InnerDstIP = 0, MAC{}, netip.Addr{}, netip.Addr{}
		if mod != nil {
			mod(c)
		}
	})
}

// udpChecksumOK verifies a UDP checksum over the IPv4 pseudo-header; 0 means "none" and passes.
func udpChecksumOK(src, dst netip.Addr, seg []byte) bool {
	if binary.BigEndian.Uint16(seg[6:8]) == 0 {
		return true
	}
	s, d := src.As4(), dst.As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 17, byte(len(seg)>>8), byte(len(seg)))
	return Checksum(append(pseudo, seg...)) == 0
}

func TestBuildPlainFrame(t *testing.T) {
	for _, size := range []int{PayloadMin, 64, 1000, PayloadMax} {
		c := plainConfig(t, func(c *Config) { c.PayloadSize, c.Flows = size, 8 })
		vx := testConfig(t, func(c *Config) { c.PayloadSize, c.Flows = size, 8 })
		for flow := range c.Flows {
			f := BuildFrame(c, flow)
			check := func(what string, got, want any) {
				t.Helper()
				if got != want {
					t.Errorf("size %d flow %d: %s = %v, want %v", size, flow, what, got, want)
				}
			}
			check("frame len", len(f), 42+size)
			check("FrameLen", c.FrameLen(), len(f))
			check("Headroom", c.Headroom(), HeadroomPlain)

			// Walk the headers by their own length fields; parseIPv4 rejects a bad header checksum.
			dst, src, b, err := parseEth(f)
			if err != nil {
				t.Fatal(err)
			}
			ip, seg, err := parseIPv4(b)
			if err != nil {
				t.Fatalf("size %d flow %d: %v", size, flow, err)
			}
			sport, dport, ulen, _, payload, err := parseUDP(seg)
			if err != nil {
				t.Fatalf("size %d flow %d: %v", size, flow, err)
			}
			check("dst mac", dst, c.DstMAC)
			check("src mac", src, c.SrcMAC)
			check("src ip", ip.src, c.SrcIP)
			check("dst ip", ip.dst, c.DstIP)
			check("proto", ip.proto, byte(17))
			check("ttl", ip.ttl, byte(64))
			check("DF", ip.df, true)
			check("ip len", int(ip.totalLen), 28+size)
			check("sport", sport, uint16(10000+flow))
			check("dport", dport, uint16(5001))
			check("udp len", int(ulen), 8+size)
			check("udp csum", udpChecksumOK(ip.src, ip.dst, seg), true)
			check("payload offset", len(f)-len(payload), HeadroomPlain)
			check("ip at offset", netip.AddrFrom4([4]byte(f[OffOuterIP+16:OffOuterIP+20])), c.DstIP)
			check("sport at offset", binary.BigEndian.Uint16(f[OffOuterUDP:]), uint16(10000+flow))

			// The same application payload as the VXLAN frame of the same flow and size.
			check("payload equals vxlan payload", string(payload), string(BuildFrame(vx, flow)[OffPayload:]))
			seq, fl, ok := ParsePayload(payload)
			check("payload ok", ok, true)
			check("payload seq", seq, uint64(0))
			check("payload flow", fl, uint32(flow))

			// Writing a sequence at Headroom keeps the frame valid and lands in the payload.
			PutPayloadHeader(f[c.Headroom():], 1<<40+7, uint32(flow))
			ip2, seg2, err := parseIPv4(f[EthLen:])
			if err != nil {
				t.Fatalf("after seq write: %v", err)
			}
			check("udp csum after write", udpChecksumOK(ip2.src, ip2.dst, seg2), true)
			seq, _, _ = ParsePayload(seg2[UDPLen:])
			check("payload seq after write", seq, uint64(1<<40+7))
		}
	}
}

// TestPlainIgnoresVXLANFields: in plain mode the VXLAN-only fields neither get defaults nor
// change the frame.
func TestPlainIgnoresVXLANFields(t *testing.T) {
	bare := plainConfig(t, nil)
	if bare.DstPort != 0 || bare.SrcPortMin != 0 || bare.SrcPortMax != 0 || !bare.InnerSrcMAC.IsZero() {
		t.Fatalf("VXLAN defaults filled in plain mode: %+v", bare)
	}
	junk := plainConfig(t, func(c *Config) {
		c.VNI, c.DstPort, c.SrcPortMin, c.SrcPortMax = 1<<24, 8472, 5, 4
		c.InnerDstMAC, c.InnerSrcIP, c.InnerDstIP = MustMAC("02:00:00:00:01:02"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	})
	if a, b := BuildFrame(bare, 0), BuildFrame(junk, 0); string(a) != string(b) {
		t.Fatalf("VXLAN-only fields changed the plain frame:\n% x\n% x", a, b)
	}
}

func TestChecksumKnownVector(t *testing.T) {
	// The IPv4 header example from RFC 1071 discussions / Wikipedia: checksum 0xb861.
	h := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
		0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if got := Checksum(h); got != 0xb861 {
		t.Fatalf("checksum %#04x, want 0xb861", got)
	}
	if got := Checksum([]byte{0x01}); got != ^uint16(0x0100) {
		t.Fatalf("odd-length checksum %#04x", got)
	}
}

func TestOuterSrcPort(t *testing.T) {
	c := testConfig(t, func(c *Config) { c.Flows = 256 })
	seen := map[uint16]bool{}
	for f := range c.Flows {
		p := OuterSrcPortOf(c, f)
		if p < DefaultSrcPortMin || p >= DefaultSrcPortMax {
			t.Fatalf("flow %d: port %d outside [%d,%d)", f, p, DefaultSrcPortMin, DefaultSrcPortMax)
		}
		if p != OuterSrcPortOf(c, f) {
			t.Fatal("port not stable per flow")
		}
		seen[p] = true
	}
	if len(seen) < 240 { // 256 flows into 28k ports: a handful of collisions at most
		t.Fatalf("only %d distinct outer ports for 256 flows", len(seen))
	}
	fixed := testConfig(t, func(c *Config) { c.Flows, c.SrcPortMin, c.SrcPortMax = 4, 4242, 4242 })
	for f := range 4 {
		if p := OuterSrcPortOf(fixed, f); p != 4242 {
			t.Fatalf("fixed port: got %d", p)
		}
	}
	narrow := testConfig(t, func(c *Config) { c.Flows, c.SrcPortMin, c.SrcPortMax = 64, 50000, 50004 })
	for f := range 64 {
		if p := OuterSrcPortOf(narrow, f); p < 50000 || p >= 50004 {
			t.Fatalf("range port %d outside [50000,50004)", p)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	bad := map[string]func(*Config){
		"no device":      func(c *Config) { c.Device = "" },
		"no dst mac":     func(c *Config) { c.DstMAC = MAC{} },
		"ipv6":           func(c *Config) { c.DstIP = netip.MustParseAddr("2001:db8::1") },
		"tiny payload":   func(c *Config) { c.PayloadSize = 8 },
		"huge payload":   func(c *Config) { c.PayloadSize = 1401 },
		"vni too big":    func(c *Config) { c.VNI = 1 << 24 },
		"no bound":       func(c *Config) { c.Count, c.Duration = 0, 0 },
		"too many flows": func(c *Config) { c.InnerSrcPort, c.Flows = 65530, 10 },
		"port range":     func(c *Config) { c.SrcPortMin, c.SrcPortMax = 5, 4 },
	}
	badPlain := map[string]func(*Config){
		"no device":      func(c *Config) { c.Device = "" },
		"no dst mac":     func(c *Config) { c.DstMAC = MAC{} },
		"no src ip":      func(c *Config) { c.SrcIP = netip.Addr{} },
		"ipv6":           func(c *Config) { c.DstIP = netip.MustParseAddr("2001:db8::1") },
		"no dst port":    func(c *Config) { c.InnerDstPort = 0 },
		"huge payload":   func(c *Config) { c.PayloadSize = PayloadMax + 1 },
		"too many flows": func(c *Config) { c.InnerSrcPort, c.Flows = 65530, 10 },
	}
	for _, set := range []struct {
		mode string
		base func(*testing.T, func(*Config)) Config
		bad  map[string]func(*Config)
	}{{"vxlan", testConfig, bad}, {"plain", plainConfig, badPlain}} {
		for name, mod := range set.bad {
			c := set.base(t, nil)
			mod(&c)
			if _, err := c.WithDefaults(); err == nil {
				t.Errorf("%s, %s: accepted", set.mode, name)
			}
		}
	}
}

func TestSenderSlotsDistinct(t *testing.T) {
	// Every slot of one batch must point at its own buffer, or a later sequence write would
	// overwrite an earlier frame of the same batch before the kernel copied it.
	for _, tc := range []struct {
		flows int
		plain bool
	}{{1, false}, {3, false}, {64, false}, {100, false}, {1, true}, {3, true}, {100, true}} {
		flows := tc.flows
		c := testConfig(t, func(c *Config) { c.Flows, c.Batch, c.Plain = flows, 64, tc.plain })
		s := newSender(c)
		for round := range 3 {
			s.fill(c.Batch)
			seen := map[*byte]bool{}
			for j := range c.Batch {
				p := s.iovs[j].Base
				if seen[p] {
					t.Fatalf("flows %d round %d: slot %d reuses a buffer", flows, round, j)
				}
				seen[p] = true
				buf := unsafeFrame(s, j, c)
				if len(buf) != c.FrameLen() || int(s.iovs[j].Len) != c.FrameLen() {
					t.Fatalf("plain %v: slot %d frame %d bytes, iov %d, want %d", tc.plain, j, len(buf), s.iovs[j].Len, c.FrameLen())
				}
				seq, fl, ok := ParsePayload(buf[c.Headroom():])
				wantFlow := (round*c.Batch + j) % flows
				wantSeq := uint64((round*c.Batch + j) / flows)
				if !ok || int(fl) != wantFlow || seq != wantSeq {
					t.Fatalf("flows %d round %d slot %d: flow %d seq %d, want %d %d", flows, round, j, fl, seq, wantFlow, wantSeq)
				}
			}
		}
	}
}

// unsafeFrame finds the frame slot j points at among the sender's buffers.
func unsafeFrame(s *sender, j int, c Config) []byte {
	for _, copies := range s.frames {
		for _, b := range copies {
			if &b[0] == s.iovs[j].Base {
				return b
			}
		}
	}
	panic("slot points at no frame")
}

func TestConfigJSONRoundTrip(t *testing.T) {
	cpu := 1
	c := testConfig(t, func(c *Config) { c.CPU, c.Netns, c.Rate = &cpu, "prg-x-h1", 1e5 })
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"dst_mac":"02:00:00:00:00:02"`) || !strings.Contains(string(b), `"inner_dst_ip":"198.19.252.2"`) {
		t.Fatalf("JSON: %s", b)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.DstMAC != c.DstMAC || back.InnerDstIP != c.InnerDstIP || *back.CPU != 1 || back.Rate != 1e5 || back.VNI != c.VNI || back.Plain {
		t.Fatalf("round trip: %+v", back)
	}
	if strings.Contains(string(b), `"plain"`) {
		t.Fatalf("plain shown for a VXLAN config: %s", b)
	}

	p := plainConfig(t, nil)
	if b, err = json.Marshal(p); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"plain":true`) {
		t.Fatalf("plain JSON: %s", b)
	}
	back = Config{}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Plain || back.DstIP != p.DstIP || back.InnerDstPort != p.InnerDstPort {
		t.Fatalf("plain round trip: %+v", back)
	}
}
