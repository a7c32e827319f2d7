package ezpath

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Rack is the hardware EZPath offloads to (datapath.Rack): the program that links ezpath hands
// a way to open one by name in its datapath.Runtime, so the mode does not depend on the lab.
type Rack = datapath.Rack

// styleDocker is the only overlay style the offload supports (one L2 overlay per tenant).
const styleDocker = "docker"

// TenantVID is the VID of the lab's first tenant on every host-ToR link (a VID is significant
// only per link; the switch maps (port, VID) to the tenant's VNI). Tenant t has TenantVIDOf(t).
const TenantVID = 100

// TenantVIDOf is tenant t's VID on the host-ToR links: 100 for tenant 1, 101 for tenant 2, ...
func TenantVIDOf(t int) uint16 { return TenantVID + uint16(t-1) }

// RelayHostDev is the host-namespace end of tenant t's relay pair: ezp0 for tenant 1 (the
// only one without tenants), ezp0-t2 for tenant 2. The overlay end is RelayDev in every tenant's
// overlay namespace.
func RelayHostDev(t int) string {
	if t <= 1 {
		return RelayDev
	}
	return fmt.Sprintf("%s-t%d", RelayDev, t)
}

// rack is a --tor lab as EZPath sees it: hosts, their switches, tenants and containers.
type rack struct {
	hw      Rack
	tenants int
	downs   map[int]int // host index -> ifindex of its ToR's "down" port
	eps     []endpoint
}

// endpoint is one container the offload can name.
type endpoint struct {
	Name   string     `json:"name"`
	Host   int        `json:"host"`
	Tenant int        `json:"tenant"` // from 1
	Addr   netip.Addr `json:"addr"`
	Veth   string     `json:"veth"` // its bridge-side veth in its tenant's overlay namespace on its host
}

// vni is tenant t's VNI; vid its VID on every host-ToR link.
func (r *rack) vni(t int) uint32 { return r.hw.TenantVNI(t) }
func (r *rack) vid(t int) uint16 { return TenantVIDOf(t) }

// tenantOfVNI is the tenant whose VNI is vni, 0 if none.
func (r *rack) tenantOfVNI(vni uint32) int {
	for t := 1; t <= r.tenants; t++ {
		if r.vni(t) == vni {
			return t
		}
	}
	return 0
}

func openRack(labName string) (*rack, error) {
	open := datapath.CurrentRuntime().OpenRack
	if open == nil {
		return nil, errors.New("ezpath: this program cannot open racks (no OpenRack in its datapath.Runtime): the offload needs a lab built with `peregrine lab up --tor`")
	}
	hw, err := open(labName)
	if err != nil {
		return nil, err
	}
	return newRack(hw)
}

// newRack checks that EZPath can offload to hw and reads what it needs of it.
func newRack(hw Rack) (*rack, error) {
	name := hw.Name()
	if !hw.HasToR() {
		return nil, fmt.Errorf("lab %q has no ToR switches: EZPath offloads to them; build it with `peregrine lab up --tor --name %s`", name, name)
	}
	if hw.Style() != styleDocker {
		return nil, fmt.Errorf("lab %q is %s style: ezpath supports the docker style (one L2 overlay per tenant); flannel's routed overlay is not offloaded", name, hw.Style())
	}
	r := &rack{hw: hw, tenants: hw.Tenants(), downs: map[int]int{}}
	_, down := hw.ToRPorts()
	for i := 1; i <= hw.Hosts(); i++ {
		idx, err := ifindexIn(hw.ToRNs(i), down)
		if err != nil {
			return nil, err
		}
		r.downs[i] = idx
	}
	for k := 0; k < hw.Containers(); k++ {
		n, hi, t, a, port, err := hw.Container(k)
		if err != nil {
			return nil, err
		}
		r.eps = append(r.eps, endpoint{Name: n, Host: hi, Tenant: t, Addr: a.Addr(), Veth: port})
	}
	return r, nil
}

// hostIndex is the index of the lab host whose namespace is target.
func (r *rack) hostIndex(target string) (int, error) {
	for i := 1; i <= r.hw.Hosts(); i++ {
		if r.hw.HostNs(i) == target {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s is not a host of lab %q", target, r.hw.Name())
}

func (r *rack) vtep(i int) netip.Addr { return r.hw.ToRAddr(i) }

func (r *rack) downIfindex(i int) int { return r.downs[i] }

// remoteVTEP is where a switch tunnels frames for the container: the ToR of its host, or the
// host's own VTEP when that host runs no EZPath (only this side offloads; it decapsulates in
// software).
func (r *rack) remoteVTEP(ep endpoint) netip.Addr {
	if !r.attached(ep.Host) {
		return r.hw.HostAddr(ep.Host)
	}
	return r.vtep(ep.Host)
}

// attached tells whether ezpath runs on host i.
func (r *rack) attached(i int) bool {
	st, err := datapath.LoadState(r.hw.HostNs(i), Name)
	return err == nil && st != nil && st.Complete
}

// endpoint finds a container by short name (h1-c1, h1-t2-c1) or overlay address. With tenants
// an address names one container per tenant: it is refused as ambiguous.
func (r *rack) endpoint(s string) (endpoint, error) {
	var byAddr []endpoint
	for _, e := range r.eps {
		if e.Name == s {
			return e, nil
		}
		if e.Addr.String() == s {
			byAddr = append(byAddr, e)
		}
	}
	if len(byAddr) == 1 {
		return byAddr[0], nil
	}
	if len(byAddr) > 1 {
		var names []string
		for _, e := range byAddr {
			names = append(names, fmt.Sprintf("%s (tenant %d)", e.Name, e.Tenant))
		}
		return endpoint{}, fmt.Errorf("overlay address %s is ambiguous in lab %q: its %d tenants use the same addresses, and %s is %s; name the container instead",
			s, r.hw.Name(), r.tenants, s, strings.Join(names, " and "))
	}
	var names []string
	for _, e := range r.eps {
		names = append(names, e.Name+" ("+e.Addr.String()+")")
	}
	return endpoint{}, fmt.Errorf("lab %q has no container %q: choose one of %s", r.hw.Name(), s, strings.Join(names, ", "))
}

// hostOf is the host of a container by short name, 0 if the rack has none of that name.
func (r *rack) hostOf(name string) int {
	for _, e := range r.eps {
		if e.Name == name {
			return e.Host
		}
	}
	return 0
}

// endpointAt finds tenant t's container with overlay address addr.
func (r *rack) endpointAt(t int, addr netip.Addr) (endpoint, bool) {
	for _, e := range r.eps {
		if e.Tenant == t && e.Addr == addr {
			return e, true
		}
	}
	return endpoint{}, false
}

func (r *rack) torDir(i int) string {
	return filepath.Join(datapath.ModePinDir(r.hw.HostNs(i), Name), "tor")
}
func (r *rack) hostDir(i int) string {
	return filepath.Join(datapath.ModePinDir(r.hw.HostNs(i), Name), "host")
}

// portIfindex is the ifindex of a container's bridge-side veth in its overlay namespace.
func (r *rack) portIfindex(e endpoint) (int, error) {
	return ifindexIn(r.hw.OverlayNs(e.Host, e.Tenant), e.Veth)
}

func ifindexIn(ns, dev string) (int, error) {
	var idx int
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("ezpath: %s/%s: %w", ns, dev, err)
	}
	return idx, nil
}
