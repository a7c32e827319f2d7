package lab

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Names and addresses are pure functions of the spec, so `status`, `down` and the benchmarks
// can find every object without asking the kernel.

// NsPrefix is the prefix of every namespace of the named lab.
func NsPrefix(lab string) string { return Prefix + lab + "-" }

func hostName(i int) string         { return fmt.Sprintf("h%d", i) }
func containerName(i, j int) string { return ContainerName(i, 1, j) }
func overlayName(i int) string      { return OverlayName(i, 1) }

func (s *Spec) ns(short string) string { return NsPrefix(s.Name) + short }

// nth returns the n-th address inside prefix p (n counted from the network address).
func nth(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// HostAddr is host i's underlay address (i from 1).
func (s *Spec) HostAddr(i int) netip.Prefix {
	p := netip.MustParsePrefix(s.UnderlayCIDR)
	return netip.PrefixFrom(nth(p, i), p.Bits())
}

// HostSubnet is the /24 of host i inside the overlay CIDR (flannel: per-host subnet).
func (s *Spec) HostSubnet(i int) netip.Prefix {
	p := netip.MustParsePrefix(s.OverlayCIDR)
	return netip.PrefixFrom(nth(p, i*256), 24)
}

// ContainerAddr is container j's overlay address on host i (i, j from 1). The docker style
// shares one L2 subnet (the whole overlay CIDR); flannel gives each host its own /24.
func (s *Spec) ContainerAddr(i, j int) netip.Prefix {
	a := nth(s.HostSubnet(i), j+1) // .1 is the flannel gateway (cni0)
	if s.Style == StyleDocker {
		return netip.PrefixFrom(a, netip.MustParsePrefix(s.OverlayCIDR).Bits())
	}
	return netip.PrefixFrom(a, 24)
}

// LinuxAddr is host i's overlay address in the linux style, on its vxlan0: the whole overlay
// CIDR is one L2 subnet, as in the docker style, and host i takes the address the docker style
// gives its first container (198.19.<i>.2/16), so tools that compute frames for "the first
// endpoint of host i" (the injector) address the same thing in both styles.
func (s *Spec) LinuxAddr(i int) netip.Prefix {
	return netip.PrefixFrom(nth(s.HostSubnet(i), 2), netip.MustParsePrefix(s.OverlayCIDR).Bits())
}

// LinuxMAC is host i's vxlan0 MAC in the linux style: the MAC the docker style gives the
// container with the same address (ContainerMAC(i, 1)), derived from LinuxAddr.
func (s *Spec) LinuxMAC(i int) net.HardwareAddr { return macFromAddr(0x02, s.LinuxAddr(i).Addr()) }

// GatewayAddr is cni0's address on host i (flannel).
func (s *Spec) GatewayAddr(i int) netip.Prefix { return netip.PrefixFrom(nth(s.HostSubnet(i), 1), 24) }

// FlannelAddr is flannel.1's address on host i: the network address of its /24, as flannel does.
func (s *Spec) FlannelAddr(i int) netip.Prefix { return netip.PrefixFrom(s.HostSubnet(i).Addr(), 32) }

// Deterministic locally administered MACs: tools (the injector, tests) can compute them.
func macFromAddr(first byte, a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{first, 0x42, b[0], b[1], b[2], b[3]}
}

// ContainerMAC is the MAC of container j on host i (Docker derives MACs from IPs the same way).
func (s *Spec) ContainerMAC(i, j int) net.HardwareAddr {
	return macFromAddr(0x02, s.ContainerAddr(i, j).Addr())
}

// UnderlayMAC is host i's eth0 MAC.
func (s *Spec) UnderlayMAC(i int) net.HardwareAddr { return macFromAddr(0x0a, s.HostAddr(i).Addr()) }

// VTEPMAC is host i's VXLAN device MAC (flannel.1; the docker style's vxlan0).
func (s *Spec) VTEPMAC(i int) net.HardwareAddr { return macFromAddr(0x06, s.HostAddr(i).Addr()) }

// OverlayMTU is the MTU inside the overlay: the underlay's minus the 50 bytes of VXLAN headers.
func (s *Spec) OverlayMTU() int { return s.MTU - 50 }

// netipPrefixZero is the default route (an invalid prefix means "no Dst" to route()).
var netipPrefixZero netip.Prefix
