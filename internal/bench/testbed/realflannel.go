package testbed

import (
	"context"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// StyleRealFlannel measures on flannel itself (internal/lab/realflannel: etcd, flanneld's
// VXLAN backend, pods made by CNI ADD) rather than on peregrine's imitation of its layout, so a
// ratio measured on it is a real CNI's.
const StyleRealFlannel = "real-flannel"

// StyleRealFlannelNoCsum is real flannel with flannel.1's outer UDP checksums off (noudpcsum;
// flanneld leaves the kernel's default, udpcsum): what that one choice costs the normal path.
const StyleRealFlannelNoCsum = "real-flannel-nocsum"

// IsRealFlannel says whether a style runs on the real flannel lab.
func IsRealFlannel(style string) bool {
	return style == StyleRealFlannel || style == StyleRealFlannelNoCsum
}

// upRealFlannel brings up 2 nodes of the real flannel lab with s.Containers pods each, attaches
// the stack on both nodes, and measures from node 1's first pod to node 2's first pod.
func upRealFlannel(ctx context.Context, s Spec, log func(string, ...any)) (*Testbed, error) {
	if s.ToR {
		return nil, fmt.Errorf("%s: the %s style takes no --tor (its underlay is one veth pair between the two nodes)", s.Config, StyleRealFlannel)
	}
	if s.NAPIThread && len(s.RxCPUs) == 0 {
		return nil, fmt.Errorf("%s: --napi-thread needs --rx-cpus (the CPUs its thread is pinned to)", s.Config)
	}
	if s.SameNode || s.ProxyMode != "" {
		return nil, fmt.Errorf("%s: the %s style has no Services and measures across nodes: leave out --same-node and --via-service (the flannel style has both)", s.Config, StyleRealFlannel)
	}
	pods := max(s.Containers, 1)
	if s.Background {
		pods = max(pods, 2)
	}
	spec := realflannel.Spec{Name: labName(s.Index), Nodes: 2, Pods: pods, NoUDPCsum: s.Style == StyleRealFlannelNoCsum}
	log("bringing up real flannel lab %s for %s", spec.Name, s.Config)
	rf, err := realflannel.Up(ctx, spec, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Config, err)
	}
	tb := &Testbed{Config: s.Config, real: rf, Knobs: map[string]string{}}
	// The run's receive arrangement, as peregrine's lab sets it on its hosts' eth0 (the lab's
	// eth0 is already NIC-like: a veth pair, GRO, pfifo_fast): RPS to the IRQ CPUs (a NIC's RSS)
	// and, with --napi-thread, the NAPI poll itself there, which the modes then leave alone.
	if len(s.RxCPUs) > 0 {
		for _, n := range rf.Nodes {
			if err := lab.SetRPS(n.Netns, realflannel.UnderlayDev, s.RxCPUs); err != nil {
				tb.Teardown()
				return nil, fmt.Errorf("%s: RPS on %s: %w", s.Config, n.Netns, err)
			}
			if s.NAPIThread {
				if err := lab.SetNAPIThread(n.Netns, realflannel.UnderlayDev, s.RxCPUs); err != nil {
					tb.Teardown()
					return nil, fmt.Errorf("%s: NAPI thread on %s: %w", s.Config, n.Netns, err)
				}
			}
		}
	}
	nodes := make([]string, len(rf.Nodes))
	for i, n := range rf.Nodes {
		nodes[i] = n.Netns
	}
	if err := tb.attachStack(ctx, s, nodes, ""); err != nil {
		tb.Teardown()
		return nil, err
	}
	node := func(p realflannel.Pod) lab.Node {
		return lab.Node{Name: fmt.Sprintf("n%d-%s", p.Node, p.Name), Netns: p.Netns, Role: "container",
			Addr: p.Addr.String() + "/24"}
	}
	onNode := func(i int) []realflannel.Pod {
		return slices.DeleteFunc(slices.Clone(rf.Pods), func(p realflannel.Pod) bool { return p.Node != i })
	}
	p1, p2 := onNode(1), onNode(2)
	tb.Sender, tb.Receiver = node(p1[0]), node(p2[0])
	tb.SenderHost = rf.Nodes[0].Netns
	if s.Background {
		tb.BGSender, tb.BGReceiver = node(p1[1]), node(p2[1])
	}
	recv := []lab.Node{{Name: "n2", Netns: rf.Nodes[1].Netns, Role: "host"}, tb.Receiver}
	tb.describeReceive(ctx, recv)
	return tb, nil
}

// devicesOf lists a namespace's devices with their stage on the receive path, named as the
// lab names them: eth0 of a node is the NIC, flannel.1 the VXLAN device, cni0 the bridge, a
// veth on the bridge the pod's host side, eth0 of a pod the pod's end.
func devicesOf(ns string, pod bool) []lab.Device {
	return stagedDevices(ns, func(kind string, a *netlink.LinkAttrs) string {
		switch {
		case kind == "vxlan":
			return "vxlan"
		case kind == "bridge":
			return "bridge"
		case kind == "veth" && a.MasterIndex != 0:
			return "veth-host"
		case kind == "veth" && a.Name == "eth0" && pod:
			return "veth"
		case kind == "veth" && a.Name == realflannel.UnderlayDev:
			return "nic"
		}
		return ""
	})
}

// stagedDevices lists namespace ns's devices, each with the stage stage gives it ("": none).
func stagedDevices(ns string, stage func(kind string, a *netlink.LinkAttrs) string) []lab.Device {
	var out []lab.Device
	_ = netnsutil.Do(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			out = append(out, lab.Device{Name: a.Name, Kind: l.Type(), MTU: a.MTU, Stage: stage(l.Type(), a)})
		}
		return nil
	})
	return out
}

// describeReceive records the receiving side's devices by stage and their offloads: recv is the
// receiving host and its container (pod).
func (tb *Testbed) describeReceive(ctx context.Context, recv []lab.Node) {
	tb.Stages = map[string]string{}
	for i := range recv {
		recv[i].Devices = devicesOf(recv[i].Netns, recv[i].Role == "container")
		for _, d := range recv[i].Devices {
			if d.Stage != "" {
				tb.Stages[recv[i].Netns+"/"+d.Name] = d.Stage
			}
		}
	}
	tb.Offloads = readOffloads(ctx, recv)
}
