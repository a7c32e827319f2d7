package fastpath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Calico's VXLAN layout (and any like it): every pod on its own unbridged veth (cali*), reached
// by a /32 route of the main table in the node's namespace; the pod's default route goes to
// 169.254.1.1, which the host-side veth answers by proxy ARP with its MAC (ee:ee:ee:ee:ee:ee).
// Packets are IP-forwarded between vxlan.calico and the pod veths, so the routed layout's
// programs serve it unchanged: egress learns the template at the underlay, ingress learns the
// delivery (the pod's MAC, the veth's MAC as source, the forwarding hop's TTL change) at the
// veth's egress and delivers through the endpoint table. What differs is who a pod is: there is
// no bridge port to find it by, so discovery reads the routes.
//
// Identity is the host's: the address is the route's destination (written by the CNI on the
// node), not what the pod puts on its eth0, and the veth is the route's device. An address routed
// to two veths (two /32 routes of different metric) is a doubly claimed address that
// endpoints.Sync refuses; delivery still goes only to the veth the normal path delivered the flow
// to (prg_fastpath_rx checks the learned veth and MAC against the table).

// discoverPods lists the pods of an overlay: those on bridge ports (flannel's cni0, docker's
// br0: endpoints.Discover) and, for a routed overlay, those on unbridged veths with a /32 route.
// (Topology discovery lists bridge ports only, so the two never name the same veth.)
func discoverPods(t *datapath.Topology, ov *overlay) ([]endpoints.Endpoint, []string) {
	eps, notes := endpoints.Discover(t, []endpoints.VXLAN{ov.VX})
	if !ov.VX.Routed {
		return eps, notes
	}
	rp, err := routedEndpoints(ov.VX)
	if err != nil {
		return eps, append(notes, fmt.Sprintf("%s: routed pods: %v", ov.VX.Dev, err))
	}
	return append(eps, rp...), notes
}

// routedEndpoints reads the pods of a routed overlay's namespace that sit on unbridged veths:
// one endpoint per /32 route (main table, no gateway) whose device is a veth on no bridge, with
// the pod's MAC read from the veth's peer (found among the named namespaces by its link-netnsid).
// A veth whose peer is not in a named namespace is skipped: without the pod's MAC the fast path
// could not check a learned delivery against the table.
func routedEndpoints(vx endpoints.VXLAN) ([]endpoints.Endpoint, error) {
	h, done, routes, err := mainRoutes(vx.Dev.Netns)
	if err != nil {
		return nil, err
	}
	defer done()
	peers := map[int]podEnd{} // by host-side ifindex, read once
	var out []endpoints.Endpoint
	for _, r := range routes {
		if r.Dst == nil || r.Type != unix.RTN_UNICAST || (r.Gw != nil && !r.Gw.Equal(net.IPv4zero)) {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != 32 || bits != 32 {
			continue
		}
		addr, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok || !addr.IsGlobalUnicast() {
			continue
		}
		pe, ok := peers[r.LinkIndex]
		if !ok {
			pe = readPodEnd(h, r.LinkIndex)
			peers[r.LinkIndex] = pe
		}
		if pe.mac == nil {
			continue
		}
		out = append(out, endpoints.Endpoint{Domain: vx.Inode, Addr: addr, Netns: vx.Dev.Netns, Veth: pe.veth,
			Ifindex: r.LinkIndex, CtrMAC: pe.mac, BrMAC: pe.hostMAC})
	}
	return out, nil
}

// podEnd is what a routed pod's veth pair tells: the host-side veth's name and MAC, the pod's MAC
// (nil: not a routed pod veth, or its peer was not found).
type podEnd struct {
	veth    string
	hostMAC net.HardwareAddr
	mac     net.HardwareAddr
}

// readPodEnd reads the host-side veth at ifindex (namespace of h) and its peer.
func readPodEnd(h *netlink.Handle, ifindex int) podEnd {
	l, err := h.LinkByIndex(ifindex)
	if err != nil || l.Type() != "veth" || l.Attrs().MasterIndex != 0 || l.Attrs().ParentIndex == 0 || l.Attrs().NetNsID < 0 {
		return podEnd{}
	}
	pe := podEnd{veth: l.Attrs().Name, hostMAC: l.Attrs().HardwareAddr}
	names, _ := netnsutil.List("")
	for _, name := range names {
		nsh, err := netnsutil.Handle(name)
		if err != nil {
			continue
		}
		id, err := h.GetNetNsIdByFd(int(nsh))
		if err != nil || id != l.Attrs().NetNsID {
			nsh.Close()
			continue
		}
		ph, err := netlink.NewHandleAt(nsh)
		nsh.Close()
		if err != nil {
			return pe
		}
		if p, err := ph.LinkByIndex(l.Attrs().ParentIndex); err == nil && p.Type() == "veth" {
			pe.mac = p.Attrs().HardwareAddr
		}
		ph.Close()
		return pe
	}
	return pe
}
