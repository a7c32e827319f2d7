package fastpath

import (
	"encoding/binary"
	"net"

	"github.com/vishvananda/netlink"
)

// The receiving half over an IPv6 underlay (bpf/fastpath_u6.h): real flannel's dual-stack
// layout runs flannel-v6.1, a VXLAN device over the nodes' IPv6 addresses with flannel.1's VNI
// and port, beside flannel.1. u6Config finds it on the overlay's underlay and tells the programs
// its local IPv6 VTEP and MAC; without one the config stays zero and every IPv6 frame on the
// underlay is the normal path's, as before.
func u6Config(host string, ov *overlay) (fpFpU6cfg, bool) {
	var c fpFpU6cfg
	h, done, err := nlHandle(host)
	if err != nil {
		return c, false
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return c, false
	}
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.Attrs().Index == ov.VX.Dev.Ifindex || vx.VxlanId != ov.VNI || vx.Port != ov.Port {
			continue
		}
		if vx.VtepDevIndex != 0 && vx.VtepDevIndex != ov.Underlay.Ifindex {
			continue
		}
		src := vx.SrcAddr
		if src == nil || src.To4() != nil {
			if src != nil {
				continue // an IPv4 VXLAN device: not the IPv6 underlay's
			}
			u, err := h.LinkByIndex(ov.Underlay.Ifindex)
			if err != nil {
				continue
			}
			addrs, err := h.AddrList(u, netlink.FAMILY_V6)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if a.IP.IsGlobalUnicast() {
					src = a.IP
					break
				}
			}
		}
		if src.To16() == nil || src.To4() != nil {
			continue
		}
		a := src.To16()
		for i := range 4 {
			c.Vtep[i] = binary.LittleEndian.Uint32(a[4*i:])
		}
		copy(c.VxMac[:], vx.Attrs().HardwareAddr)
		return c, true
	}
	return c, false
}

// u6MAC is the MAC u6Config found (for logs and tests).
func u6MAC(c fpFpU6cfg) net.HardwareAddr { return net.HardwareAddr(c.VxMac[:]) }
