// Package lab builds container overlay topologies out of network namespaces on one machine.
//
// A lab is N hosts with K containers each. Hosts are joined by an underlay (a veth pair for two
// hosts, or a switch namespace with a bridge) whose devices are tuned to behave like a NIC (GRO on
// through veth NAPI, MTU 1500, receive optionally pinned to CPUs with RPS standing in for RSS/IRQ
// affinity). On top, one of three styles:
//
//	docker:  host ns: eth0 (underlay) + the UDP socket of vxlan0 (port 4789)
//	         overlay ns (<host>-ov): vxlan0 + br0, one veth per container
//	         container ns: eth0               -> three namespaces per packet
//	flannel: host ns: eth0, flannel.1 (VXLAN, port 8472), cni0 bridge, one veth per container,
//	         a /24 per host, L3 routes and static neighbour/FDB entries (no learning)
//	native:  applications run in the host namespaces over the underlay (the baseline)
//	linux:   the dissertation's "Linux overlay": applications in the host namespaces talk over
//	         vxlan0, a VXLAN device attached to eth0 with an overlay address (one L2 subnet,
//	         static FDB/neighbour entries); no bridge, no veth, no containers
//
// With ToR (--tor) every host hangs off its own top-of-rack switch namespace (tor.go).
//
// With tenants (--tenants N, docker style) every host has one overlay per tenant: tenant t has
// its own overlay namespace (h1-ov for tenant 1, h1-t<t>-ov for the others), its own VXLAN
// device with VNI vni+t-1 and its own containers (h1-c1, h1-t2-c1, ...) that use the SAME
// overlay addresses as tenant 1's (overlapping subnets, isolated by VNI). See tenants.go.
//
// Every namespace is named "prg-<lab>-<node>", so `lab down --all` finds all of them.
package lab

import (
	"fmt"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/statepath"
)

// Prefix starts the name of every namespace, link and pinned object peregrine creates.
const Prefix = statepath.Prefix

// Styles a lab can be built in.
const (
	StyleDocker  = "docker"
	StyleFlannel = "flannel"
	StyleNative  = "native"
	// StyleLinux is the dissertation's "Linux overlay" (ch. 2): a VXLAN device in the host
	// namespace, applications on the hosts using its overlay address. It isolates the cost of
	// VXLAN itself (two receive stages: NIC, VXLAN) from the bridge and veth of container overlays.
	StyleLinux = "linux"
)

// Styles lists every style, in the order help texts name them.
var Styles = []string{StyleDocker, StyleFlannel, StyleLinux, StyleNative}

// HostEndpoints reports whether applications of the style run in the host namespaces
// (native, linux) rather than in containers; such labs have no containers.
func HostEndpoints(style string) bool { return style == StyleNative || style == StyleLinux }

// Underlay kinds.
const (
	UnderlayDirect = "direct" // one veth pair between two hosts
	UnderlaySwitch = "switch" // every host's eth0 is plugged into a bridge in a switch namespace
)

// Spec describes a lab to build. Zero fields take defaults (see Defaults). It can be read from YAML.
type Spec struct {
	Name       string `yaml:"name" json:"name"`
	Style      string `yaml:"style" json:"style"`
	Hosts      int    `yaml:"hosts" json:"hosts"`
	Containers int    `yaml:"containers" json:"containers"` // per host
	Underlay   string `yaml:"underlay" json:"underlay"`
	MTU        int    `yaml:"mtu" json:"mtu"` // underlay MTU; the overlay gets MTU-50
	// RxCPUs pins the underlay's receive processing (RPS on the hosts' eth0) to these CPUs,
	// standing in for a real NIC's RSS/IRQ affinity. Empty leaves the kernel default (no RPS:
	// with a veth underlay, receive then runs on the sender's CPU).
	RxCPUs []int `yaml:"rx_cpus" json:"rx_cpus"`
	// GRO on the underlay (veth NAPI mode), like a real NIC. Pointer so YAML can turn it off.
	GRO *bool `yaml:"gro" json:"gro"`
	// NAPIThread runs the underlay's receive NAPI (GRO: the NIC stage) in a kernel thread
	// pinned to RxCPUs, as a NIC's interrupt affinity places it. Without it a veth runs its
	// peer's NAPI on the transmitting CPU, so the emulated remote sender pays for the receiver's
	// NIC stage and RxCPUs only place what comes after RPS. Needs GRO and RxCPUs.
	NAPIThread bool `yaml:"napi_thread" json:"napi_thread,omitempty"`
	// WireFrames turns off transmit checksum offload (and with it TSO) on the hosts' underlay,
	// so what crosses the "wire" is what a real link carries: MTU-sized frames with complete
	// checksums, segmented by the sender. A veth with offloads passes 64 KB TSO super-packets
	// with unfinished checksums to its peer, which no NIC ever delivers: the receiver would
	// skip GRO entirely and XDP on the underlay would see frames it cannot checksum. Default on.
	WireFrames *bool `yaml:"wire_frames" json:"wire_frames"`

	UnderlayCIDR string `yaml:"underlay_cidr" json:"underlay_cidr"` // hosts get .1, .2, ...
	OverlayCIDR  string `yaml:"overlay_cidr" json:"overlay_cidr"`   // docker: one L2 subnet; flannel: a /24 per host
	VNI          int    `yaml:"vni" json:"vni"`
	VXLANPort    int    `yaml:"vxlan_port" json:"vxlan_port"` // default 4789 (docker) or 8472 (flannel)
	// ToR puts a top-of-rack switch namespace per host on the underlay path (host eth0 <-> ToR
	// "down"; ToRs joined by their "up" ports, directly or through the switch namespace). The
	// ToRs route the underlay as plain IP; EZPath (attach ezpath) programs them. See tor.go.
	ToR bool `yaml:"tor" json:"tor,omitempty"`
	// ToRCPUs are the CPUs the switches' receive runs on (RPS on every ToR port, so each flow
	// stays in order on one CPU, as in a switch port's FIFO). Default: the last CPU, away from
	// the emulated NIC IRQ core (CPU0); with 4+ CPUs a core of its own, standing in for silicon.
	ToRCPUs []int `yaml:"tor_cpus" json:"tor_cpus,omitempty"`
	// Tenants is the number of tenants (docker style): each gets its own overlay per host (its
	// own VXLAN device, VNI and bridge namespace) with the same container addresses as the
	// others. Default 1 (one overlay, as without the key; stored as 0, see TenantCount). See
	// tenants.go.
	Tenants int `yaml:"tenants" json:"tenants,omitempty"`
	// Services writes Kubernetes Services into every host namespace as kube-proxy does, in
	// ProxyMode (iptables, the default, or nftables). Flannel style only. See services.go.
	Services  bool   `yaml:"services" json:"services,omitempty"`
	ProxyMode string `yaml:"proxy_mode" json:"proxy_mode,omitempty"`
	// IPv6 makes the pods dual-stack (flannel style): an IPv6 address each beside the IPv4 one,
	// from OverlayCIDR6 (default DefaultOverlayCIDR6), routed as flannel's EnableIPv6 does over
	// flannel.1's IPv4 underlay. See ipv6.go.
	IPv6         bool   `yaml:"ipv6" json:"ipv6,omitempty"`
	OverlayCIDR6 string `yaml:"overlay_cidr6" json:"overlay_cidr6,omitempty"`
	// IPv6Underlay (with IPv6) carries the pods' IPv6 as real flannel's EnableIPv6 does: on a
	// second VXLAN device, flannel-v6.<VNI>, over IPv6 addresses of the hosts' eth0 (an IPv6
	// underlay). See ipv6.go.
	IPv6Underlay bool `yaml:"ipv6_underlay" json:"ipv6_underlay,omitempty"`
}

// Lab is what exists: the spec it was built from and every node with its devices.
// `peregrine lab status --json` prints this.
type Lab struct {
	Spec       Spec   `json:"spec"`
	Hosts      []Node `json:"hosts"`
	Containers []Node `json:"containers"`
	Overlays   []Node `json:"overlays,omitempty"` // docker style: the per-host overlay namespaces
	Switch     *Node  `json:"switch,omitempty"`
	ToRs       []Node `json:"tors,omitempty"` // --tor: one top-of-rack switch per host (role "tor")
	Kernel     string `json:"kernel"`
	CPUs       int    `json:"cpus"`
	// Services are the Kubernetes Services written into the hosts (--services).
	Services []Service `json:"services,omitempty"`
}

// Node is one network namespace of the lab.
type Node struct {
	Name    string   `json:"name"`  // short name used by `lab exec`: h1, h1-c1, h1-ov, sw
	Netns   string   `json:"netns"` // full namespace name: prg-<lab>-h1
	Role    string   `json:"role"`  // host, container, overlay, switch, tor
	Host    string   `json:"host,omitempty"`
	Devices []Device `json:"devices"`
	// Addr is the address applications on this node use: the overlay address of a container,
	// the underlay address of a host (linux style: the host's overlay address on vxlan0).
	Addr string `json:"addr,omitempty"`
	// Addr6 is a dual-stack container's IPv6 address (--ipv6).
	Addr6 string `json:"addr6,omitempty"`
	// Tenant is the tenant of a container or overlay namespace in a lab with 2 or more tenants
	// (from 1); 0 in a single-tenant lab. TenantOf reads it.
	Tenant int `json:"tenant,omitempty"`
}

// TenantOf is the node's tenant: 1 in a single-tenant lab.
func (n *Node) TenantOf() int {
	if n.Tenant == 0 {
		return 1
	}
	return n.Tenant
}

// Device is one link inside a node.
type Device struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"` // veth, vxlan, bridge, loopback
	MAC    string   `json:"mac,omitempty"`
	MTU    int      `json:"mtu"`
	Addrs  []string `json:"addrs,omitempty"`
	Master string   `json:"master,omitempty"`
	// Stage names the device's role on the overlay receive path: nic, vxlan, bridge, veth-host
	// (the bridge side of a container veth) or veth (the container's end, whose backlog is the third stage).
	Stage string `json:"stage,omitempty"`
	// VXLAN only.
	VNI  int `json:"vni,omitempty"`
	Port int `json:"port,omitempty"`
}

// Endpoints returns the nodes applications run on: containers, or hosts in the native and
// linux styles.
func (l *Lab) Endpoints() []Node {
	if HostEndpoints(l.Spec.Style) {
		return l.Hosts
	}
	return l.Containers
}

// Node finds a node by short name or full namespace name.
func (l *Lab) Node(name string) (*Node, error) {
	for _, set := range [][]Node{l.Hosts, l.Containers, l.Overlays, l.ToRs} {
		for i := range set {
			if set[i].Name == name || set[i].Netns == name {
				return &set[i], nil
			}
		}
	}
	if l.Switch != nil && (l.Switch.Name == name || l.Switch.Netns == name) {
		return l.Switch, nil
	}
	return nil, fmt.Errorf("lab %q has no node %q (see `peregrine lab status`)", l.Spec.Name, name)
}

// Device finds a device of the node by name.
func (n *Node) Device(name string) *Device {
	for i := range n.Devices {
		if n.Devices[i].Name == name {
			return &n.Devices[i]
		}
	}
	return nil
}

// Addr6Only returns Addr6 without a prefix length ("" when the node has none).
func (n *Node) Addr6Only() string {
	if p, err := netip.ParsePrefix(n.Addr6); err == nil {
		return p.Addr().String()
	}
	return n.Addr6
}

// AddrOnly returns Addr without a prefix length.
func (n *Node) AddrOnly() string {
	if p, err := netip.ParsePrefix(n.Addr); err == nil {
		return p.Addr().String()
	}
	return n.Addr
}
