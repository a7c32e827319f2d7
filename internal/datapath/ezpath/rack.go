package ezpath

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

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
	lab     *lab.Lab
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
func (r *rack) vni(t int) uint32 { return uint32(r.lab.Spec.TenantVNI(t)) }
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
	l, err := lab.Status(labName)
	if err != nil {
		return nil, err
	}
	if !l.Spec.ToR {
		return nil, fmt.Errorf("lab %q has no ToR switches: EZPath offloads to them; build it with `peregrine lab up --tor --name %s`", labName, labName)
	}
	if l.Spec.Style != lab.StyleDocker {
		return nil, fmt.Errorf("lab %q is %s style: ezpath supports the docker style (one L2 overlay per tenant); flannel's routed overlay is not offloaded", labName, l.Spec.Style)
	}
	r := &rack{lab: l, tenants: l.Spec.TenantCount(), downs: map[int]int{}}
	for i := 1; i <= l.Spec.Hosts; i++ {
		idx, err := ifindexIn(torNs(l, i), lab.ToRDown)
		if err != nil {
			return nil, err
		}
		r.downs[i] = idx
	}
	for _, c := range l.Containers {
		hi, t, cj, ok := lab.ParseContainerName(c.Name)
		if !ok {
			return nil, fmt.Errorf("lab %q: %q is not a container name", labName, c.Name)
		}
		a, err := netip.ParsePrefix(c.Addr)
		if err != nil {
			return nil, fmt.Errorf("container %s: address %q: %w", c.Name, c.Addr, err)
		}
		r.eps = append(r.eps, endpoint{Name: c.Name, Host: hi, Tenant: t, Addr: a.Addr(), Veth: "veth" + strconv.Itoa(cj)})
	}
	return r, nil
}

func torNs(l *lab.Lab, i int) string  { return lab.NsPrefix(l.Spec.Name) + lab.ToRName(i) }
func hostNs(l *lab.Lab, i int) string { return lab.NsPrefix(l.Spec.Name) + fmt.Sprintf("h%d", i) }
func ovNs(l *lab.Lab, i, t int) string {
	return lab.NsPrefix(l.Spec.Name) + lab.OverlayName(i, t)
}

// hostIndex is the index of the lab host whose namespace is target.
func (r *rack) hostIndex(target string) (int, error) {
	for i := 1; i <= r.lab.Spec.Hosts; i++ {
		if hostNs(r.lab, i) == target {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s is not a host of lab %q", target, r.lab.Spec.Name)
}

func (r *rack) vtep(i int) netip.Addr { return r.lab.Spec.ToRAddr(i) }

func (r *rack) downIfindex(i int) int { return r.downs[i] }

// remoteVTEP is where a switch tunnels frames for the container: the ToR of its host, or the
// host's own VTEP when that host runs no EZPath (only this side offloads; it decapsulates in
// software).
func (r *rack) remoteVTEP(ep endpoint) netip.Addr {
	if !r.attached(ep.Host) {
		return r.lab.Spec.HostAddr(ep.Host).Addr()
	}
	return r.vtep(ep.Host)
}

// attached tells whether ezpath runs on host i.
func (r *rack) attached(i int) bool {
	st, err := datapath.LoadState(hostNs(r.lab, i), Name)
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
			s, r.lab.Spec.Name, r.tenants, s, strings.Join(names, " and "))
	}
	var names []string
	for _, e := range r.eps {
		names = append(names, e.Name+" ("+e.Addr.String()+")")
	}
	return endpoint{}, fmt.Errorf("lab %q has no container %q: choose one of %s", r.lab.Spec.Name, s, strings.Join(names, ", "))
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
	return filepath.Join(datapath.ModePinDir(hostNs(r.lab, i), Name), "tor")
}
func (r *rack) hostDir(i int) string {
	return filepath.Join(datapath.ModePinDir(hostNs(r.lab, i), Name), "host")
}

// portIfindex is the ifindex of a container's bridge-side veth in its overlay namespace.
func (r *rack) portIfindex(e endpoint) (int, error) {
	return ifindexIn(ovNs(r.lab, e.Host, e.Tenant), e.Veth)
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
