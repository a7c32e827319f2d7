package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// nsLinks is a netlink handle bound to one namespace, with the few operations the lab needs.
// Errors name the namespace and the device so a failed build says exactly what broke.
type nsLinks struct {
	ns string
	nh netns.NsHandle
	h  *netlink.Handle
}

func openNs(ns string) (*nsLinks, error) {
	nh, err := netnsutil.Handle(ns)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(nh)
	if err != nil {
		nh.Close()
		return nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	return &nsLinks{ns: ns, nh: nh, h: h}, nil
}

func (n *nsLinks) Close() {
	n.h.Close()
	n.nh.Close()
}

func (n *nsLinks) errf(dev, what string, err error) error {
	msg := fmt.Sprintf("%s: %s %s: %v", n.ns, what, dev, err)
	if strings.Contains(err.Error(), "not supported") {
		msg += " (the kernel lacks this device type: check CONFIG_VXLAN/CONFIG_VETH/CONFIG_BRIDGE)"
	}
	return fmt.Errorf("%s", msg)
}

func (n *nsLinks) link(name string) (netlink.Link, error) {
	l, err := n.h.LinkByName(name)
	if err != nil {
		return nil, n.errf(name, "find", err)
	}
	return l, nil
}

// veth creates a veth pair with this end named name here and the peer in another namespace.
func (n *nsLinks) veth(name string, mac net.HardwareAddr, peer *nsLinks, peerName string, peerMAC net.HardwareAddr, mtu int) error {
	return n.vethAt(name, 0, mac, peer, peerName, peerMAC, mtu)
}

// vethAt is veth with this end's ifindex chosen (0: the kernel picks).
func (n *nsLinks) vethAt(name string, index int, mac net.HardwareAddr, peer *nsLinks, peerName string, peerMAC net.HardwareAddr, mtu int) error {
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU, la.HardwareAddr, la.Index = name, mtu, mac, index
	v := &netlink.Veth{LinkAttrs: la, PeerName: peerName, PeerHardwareAddr: peerMAC, PeerNamespace: netlink.NsFd(int(peer.nh))}
	if err := n.h.LinkAdd(v); err != nil {
		return n.errf(name, "create veth", err)
	}
	return nil
}

func (n *nsLinks) bridge(name string, mtu int) error {
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = name, mtu
	if err := n.h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		return n.errf(name, "create bridge", err)
	}
	return nil
}

type vxlanConf struct {
	name  string
	vni   int
	port  int
	local netip.Addr
	dev   string // underlay device
	mtu   int
	mac   net.HardwareAddr
	proxy bool // answer ARP from the neighbour table, as Docker's overlay does
}

func (n *nsLinks) vxlan(c vxlanConf) error {
	under, err := n.link(c.dev)
	if err != nil {
		return err
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU, la.HardwareAddr = c.name, c.mtu, c.mac
	v := &netlink.Vxlan{
		LinkAttrs:    la,
		VxlanId:      c.vni,
		Port:         c.port,
		SrcAddr:      net.IP(c.local.AsSlice()),
		VtepDevIndex: under.Attrs().Index,
		Learning:     false, // static FDB, like both Docker and flannel
		Proxy:        c.proxy,
	}
	if err := n.h.LinkAdd(v); err != nil {
		return n.errf(c.name, "create vxlan", err)
	}
	return nil
}

func (n *nsLinks) moveTo(name string, dst *nsLinks) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.h.LinkSetNsFd(l, int(dst.nh)); err != nil {
		return n.errf(name, "move to "+dst.ns, err)
	}
	return nil
}

func (n *nsLinks) master(name, master string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	m, err := n.link(master)
	if err != nil {
		return err
	}
	if err := n.h.LinkSetMasterByIndex(l, m.Attrs().Index); err != nil {
		return n.errf(name, "enslave to "+master, err)
	}
	return nil
}

func (n *nsLinks) up(names ...string) error {
	for _, name := range names {
		l, err := n.link(name)
		if err != nil {
			return err
		}
		if err := n.h.LinkSetUp(l); err != nil {
			return n.errf(name, "set up", err)
		}
	}
	return nil
}

// queue gives a device pfifo_fast as its root qdisc, a single-queue NIC's classic default. A veth
// is created with none (noqueue): when its peer's ring is full it drops, where a NIC driver
// stops its queue and the qdisc holds the packet (backpressure: the kernel's veth does the same
// once it has a qdisc). Without it a bulk flow's sender loses packets at the underlay and
// retransmits in every mode, native included, which no NIC-backed node does.
func (n *nsLinks) queue(name string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	q := &netlink.PfifoFast{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)},
		Bands: 3, PriorityMap: [16]uint8{1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}}
	if err := n.h.QdiscReplace(q); err != nil {
		return n.errf(name, "add pfifo_fast qdisc", err)
	}
	return nil
}

func (n *nsLinks) addr(name string, p netip.Prefix) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}}
	if err := n.h.AddrAdd(l, a); err != nil {
		return n.errf(name, "add address "+p.String()+" to", err)
	}
	return nil
}

// fdb adds a static VXLAN forwarding entry: inner MAC -> remote VTEP.
func (n *nsLinks) fdb(dev string, mac net.HardwareAddr, vtep netip.Addr) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	nb := &netlink.Neigh{
		LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: net.IP(vtep.AsSlice()), HardwareAddr: mac,
	}
	if err := n.h.NeighAppend(nb); err != nil {
		return n.errf(dev, "add fdb entry "+mac.String()+" via "+vtep.String()+" on", err)
	}
	return nil
}

// neigh adds a permanent ARP entry.
func (n *nsLinks) neigh(dev string, ip netip.Addr, mac net.HardwareAddr) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	nb := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.IP(ip.AsSlice()), HardwareAddr: mac}
	if err := n.h.NeighSet(nb); err != nil {
		return n.errf(dev, "add neighbour "+ip.String()+" on", err)
	}
	return nil
}

// route adds dst via gw on dev; onlink lets flannel route via an address outside any local subnet.
func (n *nsLinks) route(dev string, dst netip.Prefix, gw netip.Addr, onlink bool) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice())}
	if dst.IsValid() {
		r.Dst = &net.IPNet{IP: net.IP(dst.Addr().AsSlice()), Mask: net.CIDRMask(dst.Bits(), 32)}
	}
	if onlink {
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if !gw.IsValid() {
		r.Scope = netlink.SCOPE_LINK // a device route, as `ip route add X dev D` makes
	}
	if err := n.h.RouteAdd(r); err != nil {
		return n.errf(dev, "add route "+dst.String()+" via "+gw.String()+" on", err)
	}
	return nil
}

// ethtool toggles offload features; veth has no netlink API for them in our netlink library.
func ethtool(ctx context.Context, ns, dev string, kv ...string) error {
	args := append([]string{"ethtool", "-K", dev}, kv...)
	_, err := netnsutil.Run(ctx, ns, args...)
	return err
}
