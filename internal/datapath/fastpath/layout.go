package fastpath

import (
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// noPods says what attach looked for when an overlay has no pod the fast path can serve, or
// refuses the layout when its pods are of a kind the fast path does not handle: Calico's
// (each pod on an unbridged veth, cali*, reached by a /32 route, behind a proxy-ARP gateway
// 169.254.1.1 and the MAC ee:ee:ee:ee:ee:ee). The fast path learns how the kernel delivers a
// flow to a pod's bridge port; a layout with no bridge would take the fast path on no flow, and
// attaching to it would only look like success.
func noPods(ov *overlay) (string, error) {
	rp, err := routedPods(ov.VX.Dev.Netns)
	if err != nil {
		return "", fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	if len(rp) > 0 {
		return "", fmt.Errorf("fastpath: %s: the pods of %s are on unbridged veths reached by /32 routes (%s: Calico's routed layout); the fast path serves pods on a bridge (flannel's cni0, docker's br0) and does not handle this layout: nothing was changed (other overlays: --%s)",
			ov.VX.Dev, netnsutil.Label(ov.VX.Dev.Netns), strings.Join(rp, ", "), strings.ReplaceAll(OptVXLANDev, "_", "-"))
	}
	where := "veths on a bridge in " + netnsutil.Label(ov.VX.Dev.Netns)
	if ov.Layout == LayoutBridged {
		where = fmt.Sprintf("veths on %s's bridge %s in %s", ov.VX.Dev.Name, ov.VX.Dev.Master, netnsutil.Label(ov.VX.Dev.Netns))
	}
	return fmt.Sprintf("%s: no pods found (looked for %s, each with its peer in a named namespace or a container's); the agent picks up pods that appear later", ov.VX.Dev, where), nil
}

// routedPods lists the veths of namespace ns that carry a /32 route of the main table and are
// on no bridge: pods reached by routing alone (Calico's cali* layout), at most a few named.
func routedPods(ns string) ([]string, error) {
	h, done, err := nlHandle(ns)
	if err != nil {
		return nil, err
	}
	defer done()
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []string
	seen := map[int]bool{}
	for _, r := range routes {
		if r.Dst == nil || seen[r.LinkIndex] {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != 32 || bits != 32 || r.Gw != nil && !r.Gw.Equal(net.IPv4zero) {
			continue
		}
		l, err := h.LinkByIndex(r.LinkIndex)
		if err != nil || l.Type() != "veth" || l.Attrs().MasterIndex != 0 {
			continue
		}
		seen[r.LinkIndex] = true
		if len(out) == 4 {
			out = append(out, "...")
			break
		}
		out = append(out, l.Attrs().Name)
	}
	return out, nil
}
