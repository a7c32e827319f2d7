// Package datapath attaches peregrine's datapath modes to an overlay node and detaches them,
// restoring every knob it touched. A node is a host network namespace (the current one on a
// real machine, or a lab host); attach discovers the overlay devices behind it by itself.
package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Stages of the overlay receive path, in the order a packet meets them.
const (
	StageNIC      = "nic"       // the underlay device: IRQ/NAPI, GRO, IP/UDP, vxlan_rcv
	StageVXLAN    = "vxlan"     // gro_cells of the VXLAN device, then the bridge
	StageVethHost = "veth-host" // bridge side of a container veth: its backlog carries the container's sends
	StageVeth     = "veth"      // container side of a veth: netif_rx backlog, then the container's stack
)

// Dev is one device of the overlay path.
type Dev struct {
	Netns   string `json:"netns"` // namespace name or path; "" is the namespace peregrine runs in
	Name    string `json:"name"`
	Ifindex int    `json:"ifindex"`
	Stage   string `json:"stage"`
	Master  string `json:"master,omitempty"`
	// Peer is the other end of a veth ("netns/name", as String prints it), when discovery found it.
	Peer string `json:"peer,omitempty"`
}

func (d Dev) String() string {
	ns := d.Netns
	if ns == "" {
		ns = "(current)"
	}
	return ns + "/" + d.Name
}

// Topology is what discovery found behind one host namespace.
type Topology struct {
	Host  string   `json:"host"`
	Devs  []Dev    `json:"devices"`
	Notes []string `json:"notes,omitempty"` // things discovery saw but could not follow
	// VXLANPorts are the UDP destination ports of the VXLAN devices found, recorded once here:
	// every program that recognises VXLAN on the underlay takes its port set from this list.
	VXLANPorts []uint16 `json:"vxlan_ports,omitempty"`
}

// VXLANPortSet is the port set for the programs (bpf/vxlan.h): the ports discovery recorded,
// or the usual two for a record written before they were recorded.
func (t *Topology) VXLANPortSet() ([]uint16, error) {
	ports := t.VXLANPorts
	if len(ports) == 0 {
		ports = flow.DefaultVXLANPorts
	}
	if len(ports) > flow.VXLANMaxPorts {
		return nil, fmt.Errorf("%d distinct VXLAN ports (%v): the programs match at most %d", len(ports), ports, flow.VXLANMaxPorts)
	}
	return slices.Clone(ports), nil
}

// addVXLANPort records a VXLAN device's destination port (0 means the kernel's default, 8472).
func (t *Topology) addVXLANPort(vx *netlink.Vxlan) {
	port := uint16(vx.Port)
	if port == 0 {
		port = 8472
	}
	if !slices.Contains(t.VXLANPorts, port) {
		t.VXLANPorts = append(t.VXLANPorts, port)
	}
}

// ByStage returns the devices of one stage.
func (t *Topology) ByStage(stage string) []Dev {
	var out []Dev
	for _, d := range t.Devs {
		if d.Stage == stage {
			out = append(out, d)
		}
	}
	return out
}

// ErrNoOverlay says the namespace has no VXLAN overlay to work on.
var ErrNoOverlay = errors.New("no overlay found")

// candidateNamespaces are the named namespaces an overlay's parts may live in: iproute2's,
// Docker's (the overlay driver keeps its namespaces as files under <exec-root>/netns, by default
// /var/run/docker/netns) and any other namespace file bind-mounted somewhere (a dockerd run with
// its own --exec-root per node, a CNI's /var/run/netns/cni-*), found in the mount table.
func candidateNamespaces(exclude string) []string {
	var out []string
	// One path per namespace: /run/netns/x in the mount table is /var/run/netns/x by another
	// name, and a namespace seen twice would be worked on twice.
	seen := map[uint64]bool{}
	if ino, err := netnsutil.Inode(netnsutil.Path(exclude)); err == nil {
		seen[ino] = true
	}
	addNS := func(n string) {
		ino, err := netnsutil.Inode(netnsutil.Path(n))
		if err != nil || seen[ino] {
			return
		}
		seen[ino] = true
		out = append(out, n)
	}
	if names, err := netnsutil.List(""); err == nil {
		for _, n := range names {
			addNS(n)
		}
	}
	if entries, err := os.ReadDir(DockerNetnsDir); err == nil {
		for _, e := range entries {
			addNS(filepath.Join(DockerNetnsDir, e.Name()))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, p := range NsfsMounts(string(b)) {
			addNS(p)
		}
	}
	return out
}

// DockerNetnsDir is where a default dockerd keeps its overlay namespaces.
const DockerNetnsDir = "/var/run/docker/netns"

// NsfsMounts lists the mount points of namespace files in a mountinfo text (proc(5)): field 5 is
// the mount point, the filesystem type follows the " - " separator. Which kind of namespace each
// is shows only when opened; openView skips what is not a network namespace. Mount points under
// /proc are processes' own namespace links, not names.
func NsfsMounts(mountinfo string) []string {
	var out []string
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != "nsfs" {
			continue
		}
		mp := unescapeMount(f[4])
		if !strings.HasPrefix(mp, "/") || strings.HasPrefix(mp, "/proc/") || filepath.Dir(mp) == netnsutil.RunDir {
			continue // iproute2's names are listed by name (under /run/netns too: candidateNamespaces keeps one path per namespace)
		}
		out = append(out, mp)
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

type nsView struct {
	name string
	nh   netns.NsHandle
	h    *netlink.Handle
	ls   []netlink.Link
}

func openView(name string) (*nsView, error) {
	nh, err := netnsutil.Handle(name)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(nh)
	if err != nil {
		nh.Close()
		return nil, err
	}
	ls, err := h.LinkList()
	if err != nil {
		h.Close()
		nh.Close()
		return nil, err
	}
	return &nsView{name: name, nh: nh, h: h, ls: ls}, nil
}

func (v *nsView) close() { v.h.Close(); v.nh.Close() }

func (v *nsView) byIndex(i int) netlink.Link {
	for _, l := range v.ls {
		if l.Attrs().Index == i {
			return l
		}
	}
	return nil
}

// nsidOf returns the id under which this view's namespace knows the other namespace (-1 if none).
func (v *nsView) nsidOf(other *nsView) int {
	id, err := v.h.GetNetNsIdByFd(int(other.nh))
	if err != nil {
		return -1
	}
	return id
}

// Discover finds the overlay devices behind a host namespace: VXLAN devices there or linked
// to it from other namespaces (Docker moves vxlan0 into its overlay namespace), the underlay
// device behind each (or underlayOverride), the bridges the VXLAN devices are enslaved to, and
// both ends of every veth on those bridges.
func Discover(host, underlayOverride string) (*Topology, error) {
	hv, err := openView(host)
	if err != nil {
		return nil, err
	}
	defer hv.close()
	views := []*nsView{hv}
	defer func() {
		for _, v := range views[1:] {
			v.close()
		}
	}()
	for _, c := range candidateNamespaces(host) {
		if v, err := openView(c); err == nil {
			views = append(views, v)
		}
	}
	t := &Topology{Host: host}
	seen := map[string]bool{}
	add := func(v *nsView, l netlink.Link, stage string) {
		d := Dev{Netns: v.name, Name: l.Attrs().Name, Ifindex: l.Attrs().Index, Stage: stage}
		if m := v.byIndex(l.Attrs().MasterIndex); m != nil {
			d.Master = m.Attrs().Name
		}
		if !seen[d.String()] {
			seen[d.String()] = true
			t.Devs = append(t.Devs, d)
		}
	}
	if underlayOverride != "" {
		l, err := hv.h.LinkByName(underlayOverride)
		if err != nil {
			return nil, fmt.Errorf("underlay device %q does not exist in %s (see `ip link`)", underlayOverride, nsLabel(host))
		}
		add(hv, l, StageNIC)
	}
	for _, v := range views {
		hostID := -1
		if v != hv {
			hostID = v.nsidOf(hv)
		}
		for _, l := range v.ls {
			vx, ok := l.(*netlink.Vxlan)
			if !ok {
				continue
			}
			// A VXLAN device belongs to this host if it lives here, or lives elsewhere with its
			// underlay (link-netns) here.
			if v != hv && (hostID < 0 || vx.Attrs().NetNsID != hostID) {
				continue
			}
			add(v, l, StageVXLAN)
			t.addVXLANPort(vx)
			if underlayOverride == "" {
				if u := underlayOf(hv, v, vx); u != nil {
					add(hv, u, StageNIC)
				} else {
					t.Notes = append(t.Notes, fmt.Sprintf("could not tell the underlay behind %s: pass --underlay", Dev{Netns: v.name, Name: vx.Name}))
				}
			}
			if m := v.byIndex(vx.Attrs().MasterIndex); m != nil {
				discoverBridgePorts(t, views, v, m, add)
			} else {
				// A routed VXLAN (flannel): decapsulated packets are forwarded by IP to the
				// container bridges of the same namespace (cni0).
				for _, l := range v.ls {
					if l.Type() == "bridge" {
						discoverBridgePorts(t, views, v, l, add)
					}
				}
			}
		}
	}
	if len(t.ByStage(StageVXLAN)) == 0 {
		return nil, fmt.Errorf("%w in %s: no VXLAN device there or linked to it; is this an overlay node (docker overlay, flannel)? For a lab host use --lab or --netns prg-<lab>-h1",
			ErrNoOverlay, nsLabel(host))
	}
	return t, nil
}

func discoverBridgePorts(t *Topology, views []*nsView, v *nsView, br netlink.Link, add func(*nsView, netlink.Link, string)) {
	for _, l := range v.ls {
		if l.Attrs().MasterIndex != br.Attrs().Index || l.Type() != "veth" {
			continue
		}
		add(v, l, StageVethHost)
		peer, pv := vethPeer(views, v, l)
		if peer == nil {
			t.Notes = append(t.Notes, fmt.Sprintf("%s: its peer is in a namespace with no name (not under /var/run/netns or /var/run/docker/netns); its stage is left alone",
				Dev{Netns: v.name, Name: l.Attrs().Name}))
			continue
		}
		add(pv, peer, StageVeth)
		linkPeers(t, Dev{Netns: v.name, Name: l.Attrs().Name}, Dev{Netns: pv.name, Name: peer.Attrs().Name})
	}
}

// linkPeers records each end of a veth pair as the other's Peer.
func linkPeers(t *Topology, a, b Dev) {
	for i := range t.Devs {
		switch t.Devs[i].String() {
		case a.String():
			t.Devs[i].Peer = b.String()
		case b.String():
			t.Devs[i].Peer = a.String()
		}
	}
}

// vethPeer finds the other end of a veth: IFLA_LINK gives its ifindex and link-netnsid its
// namespace, as an id local to v that we match against every candidate namespace.
func vethPeer(views []*nsView, v *nsView, l netlink.Link) (netlink.Link, *nsView) {
	peerIdx := l.Attrs().ParentIndex
	if peerIdx == 0 {
		return nil, nil
	}
	nsid := l.Attrs().NetNsID
	for _, pv := range views {
		if pv == v {
			if nsid < 0 {
				return pv.byIndex(peerIdx), pv
			}
			continue
		}
		if nsid >= 0 && v.nsidOf(pv) == nsid {
			return pv.byIndex(peerIdx), pv
		}
	}
	return nil, nil
}

// underlayOf finds the device a VXLAN device sends on: its configured dev, else the device
// that owns its local address, else (Docker's vxlan0 has neither) the device of the route to
// its remote VTEPs, else the default route's.
func underlayOf(hv, v *nsView, vx *netlink.Vxlan) netlink.Link {
	if vx.VtepDevIndex > 0 {
		return hv.byIndex(vx.VtepDevIndex)
	}
	if vx.SrcAddr != nil {
		for _, l := range hv.ls {
			addrs, _ := hv.h.AddrList(l, netlink.FAMILY_ALL)
			for _, a := range addrs {
				if a.IP.Equal(vx.SrcAddr) {
					return l
				}
			}
		}
	}
	if idx, _, ok := RemoteVTEPRoute(hv.h, v.h, vx.Index); ok {
		return hv.byIndex(idx)
	}
	routes, _ := hv.h.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			return hv.byIndex(r.LinkIndex)
		}
	}
	return nil
}

// RemoteVTEPs lists the remote VTEP addresses a VXLAN device's FDB sends to (its "dst" entries:
// Docker's and flannel's per-peer entries), IPv4, each once, in FDB order.
func RemoteVTEPs(vxh *netlink.Handle, vxIndex int) []net.IP {
	fdb, err := vxh.NeighList(vxIndex, unix.AF_BRIDGE)
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, n := range fdb {
		ip := n.IP.To4()
		if ip == nil || ip.IsUnspecified() || ip.IsMulticast() || slices.ContainsFunc(out, ip.Equal) {
			continue
		}
		out = append(out, ip)
	}
	return out
}

// RemoteVTEPRoute finds the underlay of a VXLAN device that names neither a device nor a local
// address: the route the host namespace (hh; the device's link-netns) takes to the device's
// remote VTEPs (its FDB, in vxh's namespace). The first remote VTEP with a route decides; src is
// that route's preferred source (the kernel's choice of outer source address when the device
// has no local address), nil if the route has none.
func RemoteVTEPRoute(hh, vxh *netlink.Handle, vxIndex int) (ifindex int, src net.IP, ok bool) {
	for _, dst := range RemoteVTEPs(vxh, vxIndex) {
		rs, err := hh.RouteGet(dst)
		if err != nil || len(rs) == 0 || rs[0].LinkIndex <= 0 {
			continue
		}
		return rs[0].LinkIndex, rs[0].Src.To4(), true
	}
	return 0, nil, false
}

// nsLabel is netnsutil.Label, short for this package's many messages.
var nsLabel = netnsutil.Label
