package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A --tor lab puts a top-of-rack switch namespace between every host and the underlay:
//
//	h1 eth0 ── down [tor1] up ══ up [tor2] down ── eth0 h2      (2 hosts: ToRs joined directly)
//	hN eth0 ── down [torN] up ── pN [sw br0]                     (more hosts: through the switch)
//
// Each ToR is an IP router: the host it serves is on-link on "down", every other host is routed
// via that host's ToR on "up". The hosts keep their one underlay /24 and reach each other through
// their ToR's MAC (static neighbours: the ToR acts as a proxy-ARP gateway), so the VXLAN overlay
// is unchanged and its packets cross both switches as plain IP. Each ToR owns an address near
// the top of the underlay /24 (its VTEP for EZPath's switch-side tunnels).

// MaxToRHosts caps --tor labs: ToR i takes underlay address .(255-i).
const MaxToRHosts = 50

// ToR device names inside a ToR namespace.
const (
	ToRDown = "down" // to the host (the host's eth0)
	ToRUp   = "up"   // to the other ToRs
)

// ToRName is the short name of host i's ToR (i from 1).
func ToRName(i int) string { return fmt.Sprintf("tor%d", i) }

// ToRAddr is ToR i's own address (its VTEP), counted down from the top of the underlay /24.
func (s *Spec) ToRAddr(i int) netip.Addr {
	p := netip.MustParsePrefix(s.UnderlayCIDR)
	return nth(netip.PrefixFrom(p.Addr(), 24), 255-i)
}

// ToRDownMAC is the MAC of ToR i's host-facing port: host i sends every underlay frame to it.
func (s *Spec) ToRDownMAC(i int) net.HardwareAddr { return macFromAddr(0x0e, s.ToRAddr(i)) }

// ToRUpMAC is the MAC of ToR i's underlay-facing port.
func (s *Spec) ToRUpMAC(i int) net.HardwareAddr { return macFromAddr(0x12, s.ToRAddr(i)) }

// hostNeighbourMAC is the MAC host i uses for the other hosts' underlay addresses.
func (s *Spec) hostNeighbourMAC(i, k int) net.HardwareAddr {
	if s.ToR {
		return s.ToRDownMAC(i)
	}
	return s.UnderlayMAC(k)
}

// torUnderlay builds the ToRs, plugs every host's eth0 into its ToR and joins the ToRs.
func (b *builder) torUnderlay() error {
	s := b.s
	b.log("creating %d top-of-rack switches (plain IP routers between the hosts)", s.Hosts)
	tors := make([]*nsLinks, s.Hosts+1)
	for i := 1; i <= s.Hosts; i++ {
		t, err := b.newNs(ToRName(i))
		if err != nil {
			return err
		}
		tors[i] = t
		for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.all.rp_filter", "0"}, {"net.ipv4.conf.default.rp_filter", "0"}} {
			if _, err := netnsutil.Sysctl(s.ns(ToRName(i)), kv[0], kv[1]); err != nil {
				return fmt.Errorf("%s: %s: %w", s.ns(ToRName(i)), kv[0], err)
			}
		}
		h, err := b.at(hostName(i))
		if err != nil {
			return err
		}
		if err := h.veth("eth0", s.UnderlayMAC(i), t, ToRDown, s.ToRDownMAC(i), s.MTU); err != nil {
			return err
		}
	}
	if s.Underlay == UnderlayDirect {
		if err := tors[1].veth(ToRUp, s.ToRUpMAC(1), tors[2], ToRUp, s.ToRUpMAC(2), s.MTU); err != nil {
			return err
		}
	} else {
		err := b.switchNs(func(i int, sw *nsLinks, port string) error {
			return tors[i].veth(ToRUp, s.ToRUpMAC(i), sw, port, nil, s.MTU)
		})
		if err != nil {
			return err
		}
	}
	for i := 1; i <= s.Hosts; i++ {
		if err := b.torRoutes(tors[i], i); err != nil {
			return err
		}
		// A veth without NAPI queues received frames on the backlog of whichever CPU sent
		// them; a TCP flow sent from two CPUs (the application, and ACK-clocked softirqs) would
		// be reordered. RPS keeps each flow on one CPU, in order, like a switch port.
		for _, dev := range []string{ToRDown, ToRUp} {
			if err := SetRPS(s.ns(ToRName(i)), dev, s.ToRCPUs); err != nil {
				return err
			}
			// Wire-like frames on the switch ports too: a veth whose sender has TSO on hands
			// its peer plain backlog packets (no NAPI, no GRO), unlike any NIC behind a switch.
			if *s.WireFrames {
				if err := ethtool(b.ctx, s.ns(ToRName(i)), dev, "tx", "off"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// torRoutes gives ToR i its address, its host on "down" and every other host via its ToR on "up".
func (b *builder) torRoutes(t *nsLinks, i int) error {
	s := b.s
	self := netip.PrefixFrom(s.ToRAddr(i), 32)
	for _, dev := range []string{ToRDown, ToRUp} {
		if err := t.addr(dev, self); err != nil {
			return err
		}
	}
	if err := t.up(ToRDown, ToRUp); err != nil {
		return err
	}
	host := s.HostAddr(i).Addr()
	if err := t.route(ToRDown, netip.PrefixFrom(host, 32), netip.Addr{}, false); err != nil {
		return err
	}
	if err := t.neigh(ToRDown, host, s.UnderlayMAC(i)); err != nil {
		return err
	}
	for k := 1; k <= s.Hosts; k++ {
		if k == i {
			continue
		}
		peer := s.ToRAddr(k)
		if err := t.route(ToRUp, netip.PrefixFrom(peer, 32), netip.Addr{}, false); err != nil {
			return err
		}
		if err := t.neigh(ToRUp, peer, s.ToRUpMAC(k)); err != nil {
			return err
		}
		if err := t.route(ToRUp, netip.PrefixFrom(s.HostAddr(k).Addr(), 32), peer, true); err != nil {
			return err
		}
	}
	return nil
}
