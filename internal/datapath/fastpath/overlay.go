package fastpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
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

// overlay is what the fast path reproduces about a node's VXLAN overlay.
type overlay struct {
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

// readOverlay reads the live settings of the topology's (first) VXLAN overlay.
func readOverlay(t *datapath.Topology) (*overlay, []string, error) {
	vxs, err := endpoints.DiscoverVXLAN(t)
	if err != nil {
		return nil, nil, fmt.Errorf("fastpath: %w", err)
	}
	if len(vxs) == 0 {
		return nil, nil, fmt.Errorf("fastpath: no VXLAN device in %s", netnsutil.Label(t.Host))
	}
	var notes []string
	for _, v := range vxs[1:] {
		notes = append(notes, fmt.Sprintf("%s: only one VXLAN overlay per node gets the fast path (%s does); its traffic takes the normal path", v.Dev, vxs[0].Dev))
	}
	ov := &overlay{VX: vxs[0], Layout: LayoutBridged}
	if ov.VX.Routed {
		ov.Layout = LayoutRouted
		if ov.VX.Dev.Netns != t.Host {
			return nil, nil, fmt.Errorf("fastpath: routed VXLAN device %s is not in the host namespace: layout not supported", ov.VX.Dev)
		}
	}
	var vx *netlink.Vxlan
	err = netnsutil.Do(ov.VX.Dev.Netns, func() error {
		l, err := netlink.LinkByName(ov.VX.Dev.Name)
		if err != nil {
			return err
		}
		v, ok := l.(*netlink.Vxlan)
		if !ok {
			return fmt.Errorf("not a VXLAN device")
		}
		vx = v
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	ov.VNI, ov.Port = vx.VxlanId, vx.Port
	if vx.TOS == 1 {
		ov.Unsup = append(ov.Unsup, "tos inherit")
	}
	ov.UDPCsum = vx.UDPCSum
	if vx.GBP || vx.FlowBased {
		ov.Unsup = append(ov.Unsup, "gbp/external (collect_md) device")
	}
	nics := t.ByStage(datapath.StageNIC)
	for _, n := range nics {
		if n.Netns == t.Host {
			ov.Underlay = n
			break
		}
	}
	if ov.Underlay.Name == "" {
		return nil, nil, fmt.Errorf("fastpath: no underlay device behind %s (pass --underlay)", ov.VX.Dev)
	}
	err = netnsutil.Do(t.Host, func() error {
		l, err := netlink.LinkByName(ov.Underlay.Name)
		if err != nil {
			return err
		}
		ov.Underlay.Ifindex = l.Attrs().Index
		ov.MTU = l.Attrs().MTU
		ov.VTEP = vx.SrcAddr.To4()
		if ov.VTEP == nil {
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
			if err != nil || len(addrs) == 0 {
				return fmt.Errorf("no IPv4 address to tell the local VTEP by")
			}
			ov.VTEP = addrs[0].IP.To4()
		}
		ov.PortMin, ov.PortMax = vx.PortLow, vx.PortHigh
		if ov.PortMin >= ov.PortMax {
			// udp_flow_src_port's default: the namespace's local port range.
			b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
			if err != nil {
				return err
			}
			f := strings.Fields(string(b))
			if len(f) != 2 {
				return fmt.Errorf("ip_local_port_range: %q", b)
			}
			ov.PortMin, _ = strconv.Atoi(f[0])
			ov.PortMax, _ = strconv.Atoi(f[1])
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fastpath: underlay %s: %w", ov.Underlay, err)
	}
	if ov.VTEP == nil {
		return nil, nil, fmt.Errorf("fastpath: %s has no IPv4 local address (IPv6 underlays are not handled)", ov.VX.Dev)
	}
	return ov, notes, nil
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
