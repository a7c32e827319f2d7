package lab

import (
	"fmt"
	"net"
	"net/netip"
)

// BridgePort is the name of container j's veth end on the bridge side (in its host's, or its
// tenant's overlay, namespace).
func BridgePort(j int) string { return fmt.Sprintf("veth%d", j) }

// Rack is a lab seen as the rack of top-of-rack switches that EZPath offloads to: it implements
// ezpath.Rack (by its methods alone: the lab imports no datapath package, and the CLI hands
// OpenRack to ezpath).
type Rack struct{ l *Lab }

// OpenRack reads a lab's record and devices (Status) as a rack.
func OpenRack(name string) (*Rack, error) {
	l, err := Status(name)
	if err != nil {
		return nil, err
	}
	return RackOf(l), nil
}

// RackOf wraps a lab already read.
func RackOf(l *Lab) *Rack { return &Rack{l: l} }

func (r *Rack) Name() string              { return r.l.Spec.Name }
func (r *Rack) Style() string             { return r.l.Spec.Style }
func (r *Rack) HasToR() bool              { return r.l.Spec.ToR }
func (r *Rack) Hosts() int                { return r.l.Spec.Hosts }
func (r *Rack) Tenants() int              { return r.l.Spec.TenantCount() }
func (r *Rack) MTU() int                  { return r.l.Spec.MTU }
func (r *Rack) VXLANPort() int            { return r.l.Spec.VXLANPort }
func (r *Rack) TenantVNI(t int) uint32    { return uint32(r.l.Spec.TenantVNI(t)) }
func (r *Rack) HostNs(i int) string       { return r.l.Spec.ns(fmt.Sprintf("h%d", i)) }
func (r *Rack) ToRNs(i int) string        { return r.l.Spec.ns(ToRName(i)) }
func (r *Rack) OverlayNs(i, t int) string { return r.l.Spec.ns(OverlayName(i, t)) }
func (r *Rack) ToRPorts() (up, down string) {
	return ToRUp, ToRDown
}
func (r *Rack) ToRAddr(i int) netip.Addr        { return r.l.Spec.ToRAddr(i) }
func (r *Rack) HostAddr(i int) netip.Addr       { return r.l.Spec.HostAddr(i).Addr() }
func (r *Rack) ToRUpMAC(i int) net.HardwareAddr { return r.l.Spec.ToRUpMAC(i) }
func (r *Rack) Containers() int                 { return len(r.l.Containers) }

// Container is the k-th container (from 0): its short name, host and tenant (from 1), overlay
// address and bridge-side port. An entry whose name is not a container's is an error.
func (r *Rack) Container(k int) (name string, host, tenant int, addr netip.Prefix, port string, err error) {
	c := r.l.Containers[k]
	i, t, j, ok := ParseContainerName(c.Name)
	if !ok {
		return "", 0, 0, netip.Prefix{}, "", fmt.Errorf("lab %q: %q is not a container name", r.Name(), c.Name)
	}
	a, err := netip.ParsePrefix(c.Addr)
	if err != nil {
		return "", 0, 0, netip.Prefix{}, "", fmt.Errorf("lab %q: container %s: address %q: %w", r.Name(), c.Name, c.Addr, err)
	}
	return c.Name, i, t, a, BridgePort(j), nil
}
