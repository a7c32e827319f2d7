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

// TenantVID is the VID of the lab's one tenant on every host-ToR link (a VID is significant
// only per link; the switch maps (port, VID) to the tenant's VNI).
const TenantVID = 100

// rack is a --tor lab as EZPath sees it: hosts, their switches and containers.
type rack struct {
	lab   *lab.Lab
	vni   uint32
	vid   uint16
	downs map[int]int // host index -> ifindex of its ToR's "down" port
	eps   []endpoint
}

// endpoint is one container the offload can name.
type endpoint struct {
	Name string     `json:"name"`
	Host int        `json:"host"`
	Addr netip.Addr `json:"addr"`
	Veth string     `json:"veth"` // its bridge-side veth in the host's overlay namespace
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
	r := &rack{lab: l, vni: uint32(l.Spec.VNI), vid: TenantVID, downs: map[int]int{}}
	for i := 1; i <= l.Spec.Hosts; i++ {
		idx, err := ifindexIn(torNs(l, i), lab.ToRDown)
		if err != nil {
			return nil, err
		}
		r.downs[i] = idx
	}
	for _, c := range l.Containers {
		hi, _ := strconv.Atoi(strings.TrimPrefix(c.Host, "h"))
		_, cj, _ := strings.Cut(c.Name, "-c")
		a, err := netip.ParsePrefix(c.Addr)
		if err != nil {
			return nil, fmt.Errorf("container %s: address %q: %w", c.Name, c.Addr, err)
		}
		r.eps = append(r.eps, endpoint{Name: c.Name, Host: hi, Addr: a.Addr(), Veth: "veth" + cj})
	}
	return r, nil
}

func torNs(l *lab.Lab, i int) string  { return lab.NsPrefix(l.Spec.Name) + lab.ToRName(i) }
func hostNs(l *lab.Lab, i int) string { return lab.NsPrefix(l.Spec.Name) + fmt.Sprintf("h%d", i) }
func ovNs(l *lab.Lab, i int) string   { return lab.NsPrefix(l.Spec.Name) + fmt.Sprintf("h%d-ov", i) }

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

// remoteVTEP is where a switch tunnels frames for addr: the ToR of the container's host, or the
// host's own VTEP when that host runs no EZPath (only this side offloads; it decapsulates in
// software).
func (r *rack) remoteVTEP(addr netip.Addr) netip.Addr {
	ep, err := r.endpoint(addr.String())
	if err != nil {
		return netip.Addr{}
	}
	if !r.attached(ep.Host) {
		return r.lab.Spec.HostAddr(ep.Host).Addr()
	}
	return r.vtep(ep.Host)
}

// attached tells whether ezpath runs on host i.
func (r *rack) attached(i int) bool {
	st, err := datapath.LoadState(hostNs(r.lab, i), ModeName)
	return err == nil && st != nil && st.Complete
}

// endpoint finds a container by short name (h1-c1) or overlay address.
func (r *rack) endpoint(s string) (endpoint, error) {
	for _, e := range r.eps {
		if e.Name == s || e.Addr.String() == s {
			return e, nil
		}
	}
	var names []string
	for _, e := range r.eps {
		names = append(names, e.Name+" ("+e.Addr.String()+")")
	}
	return endpoint{}, fmt.Errorf("lab %q has no container %q: choose one of %s", r.lab.Spec.Name, s, strings.Join(names, ", "))
}

func (r *rack) torDir(i int) string {
	return filepath.Join(datapath.PinDir(hostNs(r.lab, i)), pinSub, "tor")
}
func (r *rack) hostDir(i int) string {
	return filepath.Join(datapath.PinDir(hostNs(r.lab, i)), pinSub, "host")
}

// portIfindex is the ifindex of a container's bridge-side veth in its overlay namespace.
func (r *rack) portIfindex(e endpoint) (int, error) { return ifindexIn(ovNs(r.lab, e.Host), e.Veth) }

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
