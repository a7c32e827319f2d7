package fastpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
)

// The IPv6 underlay (bpf/fastpath_u6.h): real flannel's dual-stack layout runs flannel-v6.1, a
// VXLAN device over the nodes' IPv6 addresses with flannel.1's VNI and port, beside flannel.1.
// u6Config finds it on the overlay's underlay and tells the programs its local IPv6 VTEP and
// MAC (the receiving half) and its ifindex (the sending half redirects the inner frame to it);
// without one the configs stay zero and every IPv6 frame on the underlay is the normal path's.
func u6Config(host string, ov *overlay) (fpFpU6cfg, fpFpU6dev, bool) {
	var c fpFpU6cfg
	var d fpFpU6dev
	h, done, err := nlHandle(host)
	if err != nil {
		return c, d, false
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return c, d, false
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
		d.Ifindex = uint32(vx.Attrs().Index)
		return c, d, true
	}
	return c, d, false
}

// putU6 writes what u6Config found (attach, and the agent on every config write: a recreated
// flannel-v6.1 has another ifindex) and returns the device's name ("" when there is none).
// Without the device nothing is written: an ifindex that is gone fails tx_u6's MTU check, which
// sends the flow the normal path's way.
func putU6(p *pinned, host string, ov *overlay) (string, error) {
	c, d, ok := u6Config(host, ov)
	if !ok {
		return "", nil
	}
	if err := p.PrgFastpathU6cfg.Put(uint32(0), c); err != nil {
		return "", fmt.Errorf("fastpath: write the IPv6 underlay's config: %w", err)
	}
	if err := p.PrgFastpathU6dev.Put(uint32(0), d); err != nil {
		return "", fmt.Errorf("fastpath: write the IPv6 underlay's device: %w", err)
	}
	name := ""
	if h, done, err := nlHandle(host); err == nil {
		if l, err := h.LinkByIndex(int(d.Ifindex)); err == nil {
			name = l.Attrs().Name
		}
		done()
	}
	return name, nil
}

// u6Notes replaces attach's note that the IPv6 underlay's device (dev, beside ov's) takes the
// normal path, as a second routed overlay would: its pods' IPv6 flows are ov's programs' to serve.
func u6Notes(notes []string, dev string, ov *overlay) []string {
	for i, n := range notes {
		label, _, ok := strings.Cut(n, ": only one routed VXLAN overlay")
		if dev != "" && ok && (label == dev || strings.HasSuffix(label, "/"+dev)) {
			notes[i] = fmt.Sprintf("%s: the IPv6 underlay beside %s (same VNI and port): its pods' IPv6 flows take the fast path both ways through %s's programs (receive decapsulated in tc; send encapsulated in tc, GSO packets handed to %s, which encapsulates them)",
				label, ov.VX.Dev, ov.VX.Dev, dev)
		}
	}
	return notes
}

// u6MAC is the MAC u6Config found (for logs and tests).
func u6MAC(c fpFpU6cfg) net.HardwareAddr { return net.HardwareAddr(c.VxMac[:]) }
