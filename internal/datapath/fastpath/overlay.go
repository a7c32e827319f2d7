package fastpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Layouts the fast path knows.
const (
	// LayoutRouted is flannel's: VXLAN device, bridge, pod veths and the underlay in one (the
	// host) namespace, decapsulated frames IP-forwarded to the pods' bridge. Full bypass.
	LayoutRouted = "routed"
	// LayoutBridged is docker's: the VXLAN device enslaved to a bridge, in an overlay namespace
	// apart from the underlay. Only the bridge (both ways) and the veth backlog (receive) go.
	LayoutBridged = "bridged"
)

// overlay is what the fast path reproduces about one of a node's VXLAN overlays.
type overlay struct {
	// Index is the overlay's slot: its config (prg_fastpath_cfg[Index]), its counters, the
	// fp_ovl of the copy of the programs its devices run, and a byte of its flows' keys.
	Index    int             `json:"index"`
	Layout   string          `json:"layout"`
	VX       endpoints.VXLAN `json:"vxlan"`
	Underlay datapath.Dev    `json:"underlay"`
	VNI      int             `json:"vni"`
	Port     int             `json:"port"`
	VTEP     net.IP          `json:"vtep"`
	PortMin  int             `json:"src_port_min"`
	PortMax  int             `json:"src_port_max"` // exclusive, as udp_flow_src_port computes
	MTU      int             `json:"underlay_mtu"`
	UDPCsum  bool            `json:"udpcsum"`               // the device sets outer UDP checksums (the fast path sends 0)
	Unsup    []string        `json:"unsupported,omitempty"` // device settings the fast path does not reproduce
	// OneWay (option one_way) lets ingress take the fast path once the normal path delivered a
	// flow to the pod, without waiting for a reply (one-way UDP streams).
	OneWay bool `json:"one_way,omitempty"`
}

// maxOverlays is FP_MAX_OVL (bpf/fastpath.h).
const maxOverlays = 16

// readOverlays reads the live settings of the topology's VXLAN overlays: every one, or those
// named in only (device names; an unknown name is an error that lists the devices found).
// underlay is the --underlay override ("" to discover). A routed overlay shares the host
// namespace's routing with any other there: only the first routed one gets the fast path (the
// others are noted). Each overlay's Index is its position in the result.
func readOverlays(t *datapath.Topology, underlay string, only []string) ([]*overlay, []string, error) {
	vxs, err := endpoints.DiscoverVXLAN(t)
	if err != nil {
		return nil, nil, fmt.Errorf("fastpath: %w", err)
	}
	if len(vxs) == 0 {
		return nil, nil, fmt.Errorf("fastpath: no VXLAN device in %s", netnsutil.Label(t.Host))
	}
	if len(only) > 0 {
		var found []string
		var keep []endpoints.VXLAN
		for _, v := range vxs {
			found = append(found, v.Dev.String())
			if slices.Contains(only, v.Dev.Name) || slices.Contains(only, v.Dev.String()) {
				keep = append(keep, v)
			}
		}
		for _, n := range only {
			if !slices.ContainsFunc(keep, func(v endpoints.VXLAN) bool { return v.Dev.Name == n || v.Dev.String() == n }) {
				return nil, nil, fmt.Errorf("fastpath: %s=%s: no such VXLAN device behind %s (found: %s)", OptVXLANDev, n, netnsutil.Label(t.Host), strings.Join(found, ", "))
			}
		}
		vxs = keep
	}
	var out []*overlay
	var notes []string
	routed := ""
	for _, v := range vxs {
		if v.Routed {
			if v.Dev.Netns != t.Host {
				notes = append(notes, fmt.Sprintf("%s: a routed VXLAN device outside the host namespace: layout not supported, its traffic takes the normal path", v.Dev))
				continue
			}
			if routed != "" {
				notes = append(notes, fmt.Sprintf("%s: only one routed VXLAN overlay per namespace gets the fast path (%s does); its traffic takes the normal path", v.Dev, routed))
				continue
			}
			routed = v.Dev.String()
		}
		if len(out) == maxOverlays {
			notes = append(notes, fmt.Sprintf("%s: more than %d overlays: its traffic takes the normal path", v.Dev, maxOverlays))
			continue
		}
		ov, err := readOverlay(t, v, underlay)
		if err != nil {
			return nil, nil, err
		}
		ov.Index = len(out)
		out = append(out, ov)
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("fastpath: no VXLAN overlay behind %s the fast path can serve: %s", netnsutil.Label(t.Host), strings.Join(notes, "; "))
	}
	return out, notes, nil
}

// readOverlay reads the live settings of one VXLAN overlay.
func readOverlay(t *datapath.Topology, vxd endpoints.VXLAN, underlay string) (*overlay, error) {
	ov := &overlay{VX: vxd, Layout: LayoutBridged}
	if ov.VX.Routed {
		ov.Layout = LayoutRouted
	}
	vxh, closeVX, err := nlHandle(ov.VX.Dev.Netns)
	if err != nil {
		return nil, fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	defer closeVX()
	l, err := vxh.LinkByName(ov.VX.Dev.Name)
	if err != nil {
		return nil, fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return nil, fmt.Errorf("fastpath: %s: not a VXLAN device", ov.VX.Dev)
	}
	ov.VNI, ov.Port = vx.VxlanId, vx.Port
	if vx.TOS == 1 {
		ov.Unsup = append(ov.Unsup, "tos inherit")
	}
	ov.UDPCsum = vx.UDPCSum
	if vx.GBP || vx.FlowBased {
		ov.Unsup = append(ov.Unsup, "gbp/external (collect_md) device")
	}
	hh, closeHost, err := nlHandle(t.Host)
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	defer closeHost()
	u, src, err := underlayOf(t, hh, vxh, vx, underlay)
	if err != nil {
		return nil, fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	ov.Underlay = datapath.Dev{Netns: t.Host, Name: u.Attrs().Name, Ifindex: u.Attrs().Index, Stage: datapath.StageNIC}
	ov.MTU = u.Attrs().MTU
	switch {
	case vx.SrcAddr.To4() != nil:
		ov.VTEP = vx.SrcAddr.To4()
	case src != nil:
		ov.VTEP = src
	default:
		addrs, err := hh.AddrList(u, netlink.FAMILY_V4)
		if err != nil || len(addrs) == 0 {
			return nil, fmt.Errorf("fastpath: underlay %s: no IPv4 address to tell the local VTEP by (IPv6 underlays are not handled)", ov.Underlay)
		}
		ov.VTEP = addrs[0].IP.To4()
	}
	ov.PortMin, ov.PortMax = vx.PortLow, vx.PortHigh
	if ov.PortMin >= ov.PortMax {
		// udp_flow_src_port's default: the local port range of the namespace that sends.
		var b []byte
		err := netnsutil.Do(t.Host, func() (err error) {
			b, err = os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("fastpath: %w", err)
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return nil, fmt.Errorf("fastpath: ip_local_port_range: %q", b)
		}
		ov.PortMin, _ = strconv.Atoi(f[0])
		ov.PortMax, _ = strconv.Atoi(f[1])
	}
	return ov, nil
}

// underlayOf picks the device (in the host namespace, the VXLAN device's link-netns) an
// overlay's frames leave by, and the source address the kernel gives them when the device has
// no local address (nil when not known that way): --underlay when given; the device's own dev;
// the device owning its local address; the route to its remote VTEPs (Docker's vxlan0 names
// neither dev nor local address: its FDB names the peers); discovery's pick (the default route).
func underlayOf(t *datapath.Topology, hh, vxh *netlink.Handle, vx *netlink.Vxlan, override string) (netlink.Link, net.IP, error) {
	ridx, rsrc, routed := datapath.RemoteVTEPRoute(hh, vxh, vx.Index)
	srcFor := func(l netlink.Link) net.IP {
		if routed && l.Attrs().Index == ridx {
			return rsrc
		}
		return nil
	}
	pick := func(l netlink.Link, err error) (netlink.Link, net.IP, error) {
		if err != nil {
			return nil, nil, err
		}
		return l, srcFor(l), nil
	}
	switch {
	case override != "":
		l, err := hh.LinkByName(override)
		if err != nil {
			err = fmt.Errorf("--underlay %s: no such device in %s", override, netnsutil.Label(t.Host))
		}
		return pick(l, err)
	case vx.VtepDevIndex > 0:
		return pick(hh.LinkByIndex(vx.VtepDevIndex))
	case vx.SrcAddr.To4() != nil:
		ls, _ := hh.LinkList()
		for _, l := range ls {
			addrs, _ := hh.AddrList(l, netlink.FAMILY_V4)
			for _, a := range addrs {
				if a.IP.Equal(vx.SrcAddr) {
					return l, nil, nil
				}
			}
		}
	case routed:
		return pick(hh.LinkByIndex(ridx))
	}
	for _, n := range t.ByStage(datapath.StageNIC) {
		if n.Netns == t.Host {
			return pick(hh.LinkByName(n.Name))
		}
	}
	what := "its FDB names no remote VTEP the host routes to, and there is no default route"
	if vx.SrcAddr != nil {
		what = fmt.Sprintf("no device in %s owns its local address %s", netnsutil.Label(t.Host), vx.SrcAddr)
	}
	return nil, nil, fmt.Errorf("cannot tell the underlay device: the VXLAN device names no dev, %s; pass --underlay <device>", what)
}

// nlHandle is a netlink handle in a namespace; done closes it.
func nlHandle(ns string) (h *netlink.Handle, done func(), err error) {
	nsh, err := netnsutil.Handle(ns)
	if err != nil {
		return nil, nil, err
	}
	h, err = netlink.NewHandleAt(nsh)
	if err != nil {
		nsh.Close()
		return nil, nil, fmt.Errorf("netlink in %s: %w", netnsutil.Label(ns), err)
	}
	return h, func() { h.Close(); nsh.Close() }, nil
}

// cfg renders the overlay for the programs.
func (ov *overlay) cfg() fpFpCfg {
	c := fpFpCfg{Flags: cOn, Underlay: uint32(ov.Underlay.Ifindex), VxIfindex: uint32(ov.VX.Dev.Ifindex),
		Vtep: vtepWord(ov.VTEP), Vni: uint32(ov.VNI), Mtu: uint32(ov.MTU), Netns: ov.VX.Inode,
		VxlanPorts: [8]uint16{uint16(ov.Port)}, PortMin: uint16(ov.PortMin), PortMax: uint16(ov.PortMax)}
	copy(c.VxMac[:], ov.VX.MAC)
	if ov.Layout == LayoutRouted {
		c.Flags |= cRouted
	} else {
		c.Flags |= cDocker
	}
	if len(ov.Unsup) > 0 {
		c.Flags |= cUnsup
	}
	if ov.OneWay {
		c.Flags |= cOneWay
	}
	return c
}

// vtepWord is the VTEP address as the program keeps it. The 4-byte form is taken whatever
// the length: an overlay decoded from the record holds the 16-byte form (JSON's net.IP), and
// reading its first 4 bytes made an adopting agent take the live overlay for a changed one and
// forget every cached flow.
func vtepWord(ip net.IP) uint32 {
	v4 := ip.To4()
	if v4 == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(v4)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Skipped says which hops of the normal path each direction skips in a layout.
func Skipped(layout string) (egress, ingress string) {
	if layout == LayoutRouted {
		return "bridge, IP forwarding, VXLAN device and host IP/UDP output (encapsulated in tc, redirected to the underlay)",
			"VXLAN receive (vxlan_rcv, gro_cells), IP forwarding, bridge and veth backlog (decapsulated in tc, redirect_peer)"
	}
	return "bridge (redirected to the VXLAN device; the kernel still encapsulates, the overlay namespace's IP/UDP output stays)",
		"bridge and veth backlog (redirect_peer from the VXLAN device; the underlay's IP/UDP and vxlan_rcv stay)"
}

func devOf(ifindex int) datapath.Dev { return datapath.Dev{Ifindex: ifindex, Name: "lo"} }
