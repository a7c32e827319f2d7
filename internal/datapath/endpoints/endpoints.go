// Package endpoints finds the local pods (containers) behind an overlay's VXLAN devices and keeps
// the endpoint tables of bpf/pod.h in step with them: pod address -> bridge-side veth, MACs and a
// DEVMAP_HASH slot that holds the veth. The kernel drops a devmap slot when its device goes, so
// an eBPF program that checks the slot (prg_pod_lookup4) can never redirect to a vanished or
// replaced pod. Modes that hand frames straight to pods (prism, fastpath, ezpath) share it.
package endpoints

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// VXLAN is one VXLAN device of a topology with what delivery to its pods depends on.
type VXLAN struct {
	Dev    datapath.Dev
	Inode  uint32 // netns inode of the device's namespace: the endpoints' domain
	MAC    net.HardwareAddr
	Routed bool // no bridge master: flannel-like L3 forwarding to the container bridges
}

// Endpoint is one pod address a program may deliver to.
type Endpoint struct {
	Domain  uint32     // netns inode of the bridge-side veth's namespace (= the VXLAN device's)
	Addr    netip.Addr // the pod's inner address
	Netns   string     // namespace of the bridge-side veth
	Veth    string
	Ifindex int
	CtrMAC  net.HardwareAddr // the pod's eth0
	BrMAC   net.HardwareAddr // the bridge its veth is enslaved to
}

// Key is the endpoint's key in the table (struct prg_pod_key).
func (e Endpoint) Key() Key {
	k := Key{Netns: e.Domain, Family: 4, Addr: flow.AddrWords(e.Addr)}
	if e.Addr.Is6() {
		k.Family = 6
	}
	return k
}

// DiscoverVXLAN reads the live state of the topology's VXLAN devices.
func DiscoverVXLAN(t *datapath.Topology) ([]VXLAN, error) {
	var out []VXLAN
	for _, d := range t.ByStage(datapath.StageVXLAN) {
		ino, err := netnsutil.Inode(netnsutil.Path(d.Netns))
		if err != nil {
			return nil, fmt.Errorf("namespace of %s: %w", d, err)
		}
		v := VXLAN{Dev: d, Inode: uint32(ino), Routed: d.Master == ""}
		err = netnsutil.Do(d.Netns, func() error {
			l, err := netlink.LinkByName(d.Name)
			if err != nil {
				return err
			}
			v.Dev.Ifindex = l.Attrs().Index
			v.MAC = l.Attrs().HardwareAddr
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Pod is one pod's veth pair as the host side sees it: the bridge-side end behind a VXLAN
// device and, from that end's peer link (discovery follows it from the host), the pod's end.
type Pod struct {
	VX   VXLAN
	Host datapath.Dev // bridge-side veth, in the VXLAN device's namespace
	Ctr  datapath.Dev // the pod's end (its eth0), in the pod's namespace
}

// Pods lists the pods behind each VXLAN device: every bridge-side veth in the device's namespace
// (on the device's bridge for the docker style, on any bridge for the routed style) with its
// peer. Notes say which veths were left out and why.
func Pods(t *datapath.Topology, vxs []VXLAN) ([]Pod, []string) {
	var out []Pod
	var notes []string
	for _, vx := range vxs {
		for _, h := range t.ByStage(datapath.StageVethHost) {
			if h.Netns != vx.Dev.Netns || (!vx.Routed && h.Master != vx.Dev.Master) {
				continue
			}
			var peer *datapath.Dev
			for i := range t.Devs {
				if t.Devs[i].String() == h.Peer {
					peer = &t.Devs[i]
				}
			}
			if peer == nil {
				notes = append(notes, fmt.Sprintf("%s: container end not found, its container gets no fast path", h))
				continue
			}
			out = append(out, Pod{VX: vx, Host: h, Ctr: *peer})
		}
	}
	return out, notes
}

// Discover lists the pod addresses behind each VXLAN device: for every pod of Pods its eth0's
// global unicast addresses. These are claims, made by the pod: an address two pods claim is
// refused by Sync, and a program that redirects by the table checks the claim against where the
// normal path delivers (prism's gate, the fast path's learned veth). Notes say which veths were
// left out and why.
func Discover(t *datapath.Topology, vxs []VXLAN) ([]Endpoint, []string) {
	pods, notes := Pods(t, vxs)
	var out []Endpoint
	for _, p := range pods {
		eps, err := read(p.VX, p.Host, p.Ctr)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v (no fast path for it)", p.Host, err))
			continue
		}
		out = append(out, eps...)
	}
	return out, notes
}

func read(vx VXLAN, h, peer datapath.Dev) ([]Endpoint, error) {
	base := Endpoint{Domain: vx.Inode, Netns: h.Netns, Veth: h.Name}
	err := netnsutil.Do(h.Netns, func() error {
		l, err := netlink.LinkByName(h.Name)
		if err != nil {
			return err
		}
		base.Ifindex = l.Attrs().Index
		if l.Attrs().MasterIndex == 0 {
			return fmt.Errorf("no longer on a bridge")
		}
		br, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
		if err != nil {
			return fmt.Errorf("its bridge: %w", err)
		}
		base.BrMAC = br.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []Endpoint
	err = netnsutil.Do(peer.Netns, func() error {
		l, err := netlink.LinkByName(peer.Name)
		if err != nil {
			return err
		}
		base.CtrMAC = l.Attrs().HardwareAddr
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue // link-local and the like never come through the overlay
			}
			e := base
			e.Addr = ip.Unmap()
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// WordsAddr is flow.AddrWords (the tables' layout: the raw bytes, IPv4 in word 0) backwards.
func WordsAddr(family uint32, w [4]uint32) netip.Addr {
	if family == 4 {
		return netip.AddrFrom4([4]byte{byte(w[0]), byte(w[0] >> 8), byte(w[0] >> 16), byte(w[0] >> 24)})
	}
	var b [16]byte
	for i, x := range w {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
	return netip.AddrFrom16(b)
}
