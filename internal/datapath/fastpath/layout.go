package fastpath

import (
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// noPods says what attach looked for when an overlay has no pod the fast path can serve. Pods
// come in two kinds: on a bridge (flannel's cni0, docker's br0) and, for a routed overlay, on
// unbridged veths reached by a /32 route (Calico's cali*: layout_calico.go). Unbridged /32 veths
// that discovery could not serve (their pod end is in no named namespace) are named.
func noPods(ov *overlay) (string, error) {
	rp, err := routedPods(ov.VX.Dev.Netns)
	if err != nil {
		return "", fmt.Errorf("fastpath: %s: %w", ov.VX.Dev, err)
	}
	if len(rp) > 0 {
		return fmt.Sprintf("%s: no pods found: the unbridged veths with /32 routes in %s (%s) have their pod end in no named namespace (under %s), so their pods' MACs are unknown; they take the normal path",
			ov.VX.Dev, netnsutil.Label(ov.VX.Dev.Netns), strings.Join(rp, ", "), netnsutil.RunDir), nil
	}
	where := "veths on a bridge in " + netnsutil.Label(ov.VX.Dev.Netns)
	if ov.Layout == LayoutBridged {
		where = fmt.Sprintf("veths on %s's bridge %s in %s", ov.VX.Dev.Name, ov.VX.Dev.Master, netnsutil.Label(ov.VX.Dev.Netns))
	} else {
		where += " or unbridged veths with a /32 route (Calico's cali*)"
	}
	return fmt.Sprintf("%s: no pods found (looked for %s, each with its peer in a named namespace or a container's); the agent picks up pods that appear later", ov.VX.Dev, where), nil
}

// mainRoutes lists the IPv4 routes of namespace ns's main table, with a netlink handle of ns
// to read their devices through (done closes it; nothing to close on error).
func mainRoutes(ns string) (*netlink.Handle, func(), []netlink.Route, error) {
	h, done, err := nlHandle(ns)
	if err != nil {
		return nil, nil, nil, err
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		done()
		return nil, nil, nil, fmt.Errorf("list routes: %w", err)
	}
	return h, done, routes, nil
}

// routedPods lists the veths of namespace ns that carry a /32 route of the main table and are
// on no bridge: pods reached by routing alone (Calico's cali* layout), at most a few named.
func routedPods(ns string) ([]string, error) {
	h, done, routes, err := mainRoutes(ns)
	if err != nil {
		return nil, err
	}
	defer done()
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
