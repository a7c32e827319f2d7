package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Dual-stack (--ipv6, flannel style): every pod gets an IPv6 address beside its IPv4 one, laid
// out as flannel's EnableIPv6 lays it out (flannel-io/flannel pkg/backend/vxlan): a /64 per host
// out of the cluster's IPv6 network (flannel's default SubnetLenIPv6), cni0 holding the subnet's
// ::1 as the pods' gateway, the VXLAN device holding the subnet's network address as a /128, and
// per remote host a route to its /64 via that address (onlink), a permanent neighbour entry for
// it with the remote VTEP MAC and the FDB entry to the remote VTEP.
//
// Real flannel carries IPv6 on a second device, flannel-v6.<VNI>, whose VTEP is the node's IPv6
// address (an IPv6 underlay). By default this lab carries the IPv6 pods over flannel.1 and its
// IPv4 underlay instead (IPv6 inner, IPv4 outer: what a VXLAN device does with any Ethernet
// frame), the layout the fast path serves. With IPv6Underlay (--ipv6-underlay) it is built as
// flannel builds it: eth0 gets an IPv6 address from DefaultUnderlayCIDR6, flannel-v6.1 (its own
// MAC, MTU 70 below the underlay's: the outer IPv6 header is 20 bytes longer) holds the /128 and
// the routes, neighbours and FDB entries (to the remote hosts' IPv6 addresses).

// DefaultUnderlayCIDR6 is the hosts' IPv6 underlay network (--ipv6-underlay): a /64 beside the
// pods' /48, host i taking ::i.
const DefaultUnderlayCIDR6 = "fd70:7267:1::/64"

// HostAddr6 is host i's IPv6 underlay address (--ipv6-underlay).
func (s *Spec) HostAddr6(i int) netip.Prefix {
	return netip.PrefixFrom(nth6(netip.MustParsePrefix(DefaultUnderlayCIDR6), i), 64)
}

// VTEPMAC6 is the MAC of host i's flannel-v6.1 (--ipv6-underlay).
func (s *Spec) VTEPMAC6(i int) net.HardwareAddr { return macFromAddr(0x16, s.HostAddr(i).Addr()) }

// FlannelV6 is the name of the IPv6 underlay's VXLAN device, as flannel names it.
func (s *Spec) FlannelV6() string { return fmt.Sprintf("flannel-v6.%d", s.VNI) }

// DefaultOverlayCIDR6 is the lab's IPv6 pod network: a ULA /48 (RFC 4193) whose global ID spells
// "prg" (70 72 67), so it is recognisably peregrine's and clashes with no real network.
const DefaultOverlayCIDR6 = "fd70:7267:0::/48"

// HostSubnet6 is host i's IPv6 pod subnet: the i-th /64 of the IPv6 overlay.
func (s *Spec) HostSubnet6(i int) netip.Prefix {
	b := netip.MustParsePrefix(s.OverlayCIDR6).Masked().Addr().As16()
	b[6], b[7] = byte(i>>8), byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

// nth6 is the n-th address of IPv6 prefix p (n < 2^16, counted from the network address).
func nth6(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As16()
	b[14], b[15] = byte(n>>8), byte(n)
	return netip.AddrFrom16(b)
}

// ContainerAddr6 is container j's IPv6 address on host i (::2, ::3, ... as the IPv4 .2, .3).
func (s *Spec) ContainerAddr6(i, j int) netip.Prefix {
	return netip.PrefixFrom(nth6(s.HostSubnet6(i), j+1), 64)
}

// GatewayAddr6 is cni0's IPv6 address on host i.
func (s *Spec) GatewayAddr6(i int) netip.Prefix {
	return netip.PrefixFrom(nth6(s.HostSubnet6(i), 1), 64)
}

// FlannelAddr6 is the VXLAN device's IPv6 address on host i: the network address of its /64 as a
// /128, as flannel gives flannel-v6.1.
func (s *Spec) FlannelAddr6(i int) netip.Prefix {
	return netip.PrefixFrom(s.HostSubnet6(i).Addr(), 128)
}

func (s *Spec) validateIPv6() error {
	if !s.IPv6 {
		if s.IPv6Underlay {
			return fmt.Errorf("--ipv6-underlay carries dual-stack pods' IPv6: add --ipv6")
		}
		if s.OverlayCIDR6 != "" {
			return fmt.Errorf("overlay_cidr6 %q is set without ipv6: add --ipv6 (ipv6: true)", s.OverlayCIDR6)
		}
		return nil
	}
	if s.Style != StyleFlannel {
		return fmt.Errorf("--ipv6 (dual-stack pods) is built for the flannel style only (got %s): use --style flannel", s.Style)
	}
	if s.TenantCount() > 1 || s.ToR {
		return fmt.Errorf("--ipv6 does not combine with --tenants or --tor: drop one")
	}
	p, err := netip.ParsePrefix(s.OverlayCIDR6)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() > 48 {
		return fmt.Errorf("IPv6 overlay CIDR %q invalid: need an IPv6 prefix of /48 or larger (a /64 per host)", s.OverlayCIDR6)
	}
	return nil
}

// noDAD turns off duplicate address detection in namespace ns for the links made after it (and
// all.accept_dad): the lab's addresses are unique by construction, and a tentative address
// would hold the first packets back for a second.
func (b *builder) noDAD(short string) error {
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		if _, err := netnsutil.Sysctl(b.s.ns(short), k, "0"); err != nil {
			return fmt.Errorf("turn off DAD in %s: %w", b.s.ns(short), err)
		}
	}
	return nil
}

// addr6 adds an IPv6 address without DAD (IFA_F_NODAD).
func (n *nsLinks) addr6(name string, p netip.Prefix) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	if err := n.h.AddrAdd(l, a); err != nil {
		return n.errf(name, "add address "+p.String()+" to", err)
	}
	return nil
}

// neigh6 adds a permanent IPv6 neighbour entry.
func (n *nsLinks) neigh6(dev string, ip netip.Addr, mac net.HardwareAddr) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	nb := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: net.IP(ip.AsSlice()), HardwareAddr: mac}
	if err := n.h.NeighSet(nb); err != nil {
		return n.errf(dev, "add neighbour "+ip.String()+" on", err)
	}
	return nil
}

// route6 adds an IPv6 route (dst invalid: the default route) via gw on dev.
func (n *nsLinks) route6(dev string, dst netip.Prefix, gw netip.Addr, onlink bool) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice()), Family: netlink.FAMILY_V6}
	if dst.IsValid() {
		r.Dst = &net.IPNet{IP: net.IP(dst.Addr().AsSlice()), Mask: net.CIDRMask(dst.Bits(), 128)}
	} else {
		r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	if onlink {
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := n.h.RouteAdd(r); err != nil {
		return n.errf(dev, "add route "+dst.String()+" via "+gw.String()+" on", err)
	}
	return nil
}

// flannelHost6 adds host i's IPv6 half (see the top of this file) once its IPv4 half is built.
func (b *builder) flannelHost6(i int) error {
	s := b.s
	host, err := b.at(hostName(i))
	if err != nil {
		return err
	}
	if _, err := netnsutil.Sysctl(s.ns(hostName(i)), "net.ipv6.conf.all.forwarding", "1"); err != nil {
		return fmt.Errorf("enable IPv6 forwarding on %s: %w", s.ns(hostName(i)), err)
	}
	vx := "flannel.1"
	if s.IPv6Underlay {
		vx = s.FlannelV6()
		if err := host.addr6("eth0", s.HostAddr6(i)); err != nil {
			return err
		}
		if err := host.vxlan(vxlanConf{name: vx, vni: s.VNI, port: s.VXLANPort, local: s.HostAddr6(i).Addr(),
			dev: "eth0", mtu: s.MTU - 70, mac: s.VTEPMAC6(i)}); err != nil {
			return err
		}
		if err := host.up(vx); err != nil {
			return err
		}
	}
	if err := host.addr6(vx, s.FlannelAddr6(i)); err != nil {
		return err
	}
	if err := host.addr6("cni0", s.GatewayAddr6(i)); err != nil {
		return err
	}
	for j := 1; j <= s.Containers; j++ {
		c, err := b.at(containerName(i, j))
		if err != nil {
			return err
		}
		if err := c.addr6("eth0", s.ContainerAddr6(i, j)); err != nil {
			return err
		}
		if err := c.route6("eth0", netip.Prefix{}, s.GatewayAddr6(i).Addr(), false); err != nil {
			return err
		}
	}
	for k := 1; k <= s.Hosts; k++ {
		if k == i {
			continue
		}
		gw := s.FlannelAddr6(k).Addr()
		mac := s.VTEPMAC(k)
		if s.IPv6Underlay {
			mac = s.VTEPMAC6(k)
			if err := host.fdb(vx, mac, s.HostAddr6(k).Addr()); err != nil {
				return err
			}
		}
		if err := host.neigh6(vx, gw, mac); err != nil {
			return err
		}
		if err := host.route6(vx, s.HostSubnet6(k), gw, true); err != nil {
			return err
		}
	}
	return nil
}
