package testbed

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// StyleCalico measures on Calico VXLAN's layout as calico-node/felix and the calico CNI plugin
// program a node (scripts/handbuilt-calico.sh builds the same by hand): vxlan.calico (VNI 4096,
// UDP 4789, outer UDP checksums on, the kernel's default), every pod on its own unbridged veth
// cali* whose host end has the MAC ee:ee:ee:ee:ee:ee and answers the pod's gateway 169.254.1.1
// by proxy ARP, a /32 route per pod, the other node's /26 block via its tunnel address onlink.
// No bridge: the normal path IP-forwards between vxlan.calico and the pod veths. The underlay
// is a veth pair made NIC-like as peregrine's own lab makes its eth0 (GRO, pfifo_fast, wire
// checksums, receive on --rx-cpus), so a ratio measured here sits beside the flannel style's.
const StyleCalico = "calico"

// Calico's addressing in this layout: node i's pods in 10.65.i.0/26 (pod k at .k+1), its tunnel
// address 10.65.i.0 on vxlan.calico, its underlay address 10.252.0.i/24 on eth0.
const (
	calicoVNI  = "4096"
	calicoPort = "4789"
	calicoMTU  = "1450"
	calicoMAC  = "ee:ee:ee:ee:ee:ee" // the host end of every pod veth, as Calico sets it
)

func calicoNode(name string, i int) string   { return fmt.Sprintf("prg-%s-n%d", name, i) }
func calicoPod(name string, i, k int) string { return fmt.Sprintf("prg-%s-n%d-p%d", name, i, k) }
func calicoPodAddr(i, k int) string          { return fmt.Sprintf("10.65.%d.%d", i, k+1) }
func calicoVTEPMAC(i int) string             { return fmt.Sprintf("66:0e:3c:00:00:%02x", i) }
func calicoVeth(i, k int) string             { return fmt.Sprintf("cali%02x%02xprg", i, k) }
func calicoPrefix(name string) string        { return "prg-" + name + "-" }
func calicoUnderlayAddr(i int) string        { return fmt.Sprintf("10.252.0.%d", i) }
func calicoTunnelAddr(i int) string          { return fmt.Sprintf("10.65.%d.0", i) }

// upCalico builds the Calico layout with two nodes and s.Containers pods each, attaches the
// stack on both nodes, and measures from node 1's first pod to node 2's first pod.
func upCalico(ctx context.Context, s Spec, log func(string, ...any)) (*Testbed, error) {
	switch {
	case s.ToR:
		return nil, fmt.Errorf("%s: the %s style takes no --tor (its underlay is one veth pair between the two nodes)", s.Config, StyleCalico)
	case s.SameNode || s.ProxyMode != "" || s.IPv6:
		return nil, fmt.Errorf("%s: the %s style measures IPv4 across nodes without Services: leave out --same-node, --via-service and --ipv6 (the flannel style has them)", s.Config, StyleCalico)
	case s.NAPIThread && len(s.RxCPUs) == 0:
		return nil, fmt.Errorf("%s: --napi-thread needs --rx-cpus (the CPUs its thread is pinned to)", s.Config)
	}
	pods := max(s.Containers, 1)
	if s.Background {
		pods = max(pods, 2)
	}
	name := labName(s.Index)
	log("building Calico VXLAN layout %s for %s (%d pods per node)", name, s.Config, pods)
	tb := &Testbed{Config: s.Config, calico: name, Knobs: map[string]string{}}
	if err := buildCalico(ctx, name, pods); err != nil {
		tb.Teardown()
		return nil, fmt.Errorf("%s: %w", s.Config, err)
	}
	nodes := []string{calicoNode(name, 1), calicoNode(name, 2)}
	for _, n := range nodes {
		if len(s.RxCPUs) > 0 {
			if err := lab.SetRPS(n, "eth0", s.RxCPUs); err != nil {
				tb.Teardown()
				return nil, fmt.Errorf("%s: RPS on %s: %w", s.Config, n, err)
			}
			if s.NAPIThread {
				if err := lab.SetNAPIThread(n, "eth0", s.RxCPUs); err != nil {
					tb.Teardown()
					return nil, fmt.Errorf("%s: NAPI thread on %s: %w", s.Config, n, err)
				}
			}
		}
	}
	if err := tb.attachStack(ctx, s, nodes, ""); err != nil {
		tb.Teardown()
		return nil, err
	}
	pod := func(i, k int) lab.Node {
		return lab.Node{Name: fmt.Sprintf("n%d-p%d", i, k), Netns: calicoPod(name, i, k), Role: "container",
			Host: "", Addr: calicoPodAddr(i, k) + "/32"}
	}
	tb.Sender, tb.Receiver = pod(1, 1), pod(2, 1)
	tb.SenderHost = nodes[0]
	if s.Background {
		tb.BGSender, tb.BGReceiver = pod(1, 2), pod(2, 2)
	}
	recv := []lab.Node{{Name: "n2", Netns: nodes[1], Role: "host"}, tb.Receiver}
	tb.Stages = map[string]string{}
	for i := range recv {
		recv[i].Devices = calicoDevices(recv[i].Netns, recv[i].Role == "container")
		for _, d := range recv[i].Devices {
			if d.Stage != "" {
				tb.Stages[recv[i].Netns+"/"+d.Name] = d.Stage
			}
		}
	}
	tb.Offloads = readOffloads(ctx, recv)
	return tb, nil
}

// calicoDevices lists a namespace's devices with their stage on the receive path: eth0 of a node
// is the NIC, vxlan.calico the VXLAN device, a cali* veth the pod's host side (there is no bridge
// stage in this layout), eth0 of a pod the pod's end.
func calicoDevices(ns string, pod bool) []lab.Device {
	return stagedDevices(ns, func(kind string, a *netlink.LinkAttrs) string {
		switch {
		case kind == "vxlan":
			return "vxlan"
		case kind == "veth" && a.Name == "eth0" && pod:
			return "veth"
		case kind == "veth" && a.Name == "eth0":
			return "nic"
		case kind == "veth" && strings.HasPrefix(a.Name, "cali"):
			return "veth-host"
		}
		return ""
	})
}

// buildCalico makes the namespaces and devices of the layout (see StyleCalico). On error the
// caller removes what was made (downCalico).
func buildCalico(ctx context.Context, name string, pods int) error {
	for i := 1; i <= 2; i++ {
		if err := netnsutil.Create(calicoNode(name, i)); err != nil {
			return err
		}
	}
	n1, n2 := calicoNode(name, 1), calicoNode(name, 2)
	if _, err := netnsutil.Run(ctx, "", "ip", "link", "add", "eth0", "netns", n1, "type", "veth", "peer", "name", "eth0", "netns", n2); err != nil {
		return err
	}
	for i := 1; i <= 2; i++ {
		h := calicoNode(name, i)
		if _, err := netnsutil.Sysctl(h, "net.ipv4.ip_forward", "1"); err != nil {
			return fmt.Errorf("%s: ip_forward: %w", h, err)
		}
		cmds := [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "addr", "add", calicoUnderlayAddr(i) + "/24", "dev", "eth0"},
			{"ip", "link", "set", "eth0", "up"},
			// NIC-like eth0, as internal/lab and the real-flannel lab make theirs.
			{"ethtool", "-K", "eth0", "tx", "off", "gro", "on"},
			{"tc", "qdisc", "replace", "dev", "eth0", "root", "pfifo_fast"},
			// A node has a default route: proxy ARP answers for 169.254.1.1 only if it routes it.
			{"ip", "route", "add", "default", "via", "10.252.0.254", "dev", "eth0", "onlink"},
			{"ip", "link", "add", "vxlan.calico", "type", "vxlan", "id", calicoVNI, "local", calicoUnderlayAddr(i), "dev", "eth0",
				"dstport", calicoPort, "nolearning"},
			{"ip", "link", "set", "vxlan.calico", "address", calicoVTEPMAC(i), "mtu", calicoMTU, "up"},
			{"ip", "addr", "add", calicoTunnelAddr(i) + "/32", "dev", "vxlan.calico"},
			{"ip", "route", "add", "blackhole", fmt.Sprintf("10.65.%d.0/26", i)},
		}
		if err := runIn(ctx, h, cmds); err != nil {
			return err
		}
		for k := 1; k <= pods; k++ {
			if err := addCalicoPod(ctx, name, i, k); err != nil {
				return err
			}
		}
	}
	for i := 1; i <= 2; i++ {
		j := 3 - i
		if err := runIn(ctx, calicoNode(name, i), [][]string{
			{"ip", "neigh", "add", calicoTunnelAddr(j), "lladdr", calicoVTEPMAC(j), "dev", "vxlan.calico", "nud", "permanent"},
			{"bridge", "fdb", "add", calicoVTEPMAC(j), "dev", "vxlan.calico", "dst", calicoUnderlayAddr(j), "self", "permanent"},
			{"ip", "route", "add", fmt.Sprintf("10.65.%d.0/26", j), "via", calicoTunnelAddr(j), "dev", "vxlan.calico", "onlink"},
		}); err != nil {
			return err
		}
	}
	// Every pod reaches the other node's first pod before anything is measured.
	for i := 1; i <= 2; i++ {
		if _, err := netnsutil.Run(ctx, calicoPod(name, i, 1), "ping", "-c", "1", "-W", "2", calicoPodAddr(3-i, 1)); err != nil {
			return fmt.Errorf("calico layout %s: pod n%d-p1 does not reach n%d-p1: %w", name, i, 3-i, err)
		}
	}
	return nil
}

// addCalicoPod makes pod k of node i as the calico CNI plugin does: a veth cali* in the node
// with Calico's MAC, proxy ARP and a /32 route; in the pod the /32 address and a default route
// via 169.254.1.1 on eth0.
func addCalicoPod(ctx context.Context, name string, i, k int) error {
	h, p, veth := calicoNode(name, i), calicoPod(name, i, k), calicoVeth(i, k)
	if err := netnsutil.Create(p); err != nil {
		return err
	}
	if err := runIn(ctx, h, [][]string{
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", p},
		{"ip", "link", "set", veth, "address", calicoMAC, "mtu", calicoMTU, "up"},
	}); err != nil {
		return err
	}
	for _, kv := range [][2]string{{"net.ipv4.conf." + veth + ".proxy_arp", "1"}, {"net.ipv4.neigh." + veth + ".proxy_delay", "0"},
		{"net.ipv4.conf." + veth + ".forwarding", "1"}} {
		if _, err := netnsutil.Sysctl(h, kv[0], kv[1]); err != nil {
			return fmt.Errorf("%s: %s: %w", h, kv[0], err)
		}
	}
	if err := runIn(ctx, h, [][]string{{"ip", "route", "add", calicoPodAddr(i, k) + "/32", "dev", veth, "scope", "link"}}); err != nil {
		return err
	}
	return runIn(ctx, p, [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", calicoPodAddr(i, k) + "/32", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "mtu", calicoMTU, "up"},
		{"ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
		{"ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
	})
}

func runIn(ctx context.Context, ns string, cmds [][]string) error {
	for _, c := range cmds {
		if _, err := netnsutil.Run(ctx, ns, c...); err != nil {
			return err
		}
	}
	return nil
}

// downCalico removes every namespace of the layout (pods first: their veths go with them).
func downCalico(name string) error {
	nss, err := netnsutil.List(calicoPrefix(name))
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		if strings.Count(strings.TrimPrefix(ns, calicoPrefix(name)), "-") == 1 { // a pod
			errs = append(errs, netnsutil.Delete(ns))
		}
	}
	for _, ns := range nss {
		if strings.Count(strings.TrimPrefix(ns, calicoPrefix(name)), "-") == 0 { // a node
			errs = append(errs, netnsutil.Delete(ns))
		}
	}
	return errors.Join(errs...)
}
