package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// UnderlayDev is every node's NIC.
const UnderlayDev = "eth0"

// switchNs joins the nodes when there are not exactly two (two get a direct veth pair).
const switchNs = Prefix + "sw"

// buildNodes makes every node's network namespace, its underlay NIC and its mount namespace.
func (c *Cluster) buildNodes(ctx context.Context) error {
	n := c.Spec.Nodes
	for i := 1; i <= n; i++ {
		if err := netnsutil.Create(NodeName(i)); err != nil {
			return err
		}
	}
	if n == 2 {
		if _, err := netnsutil.Run(ctx, "", "ip", "link", "add", UnderlayDev, "netns", NodeName(1), "type", "veth",
			"peer", "name", UnderlayDev, "netns", NodeName(2)); err != nil {
			return err
		}
	} else {
		if err := netnsutil.Create(switchNs); err != nil {
			return err
		}
		if err := runIn(ctx, switchNs, [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "br0", "type", "bridge"}, {"ip", "link", "set", "br0", "up"}}); err != nil {
			return err
		}
		_, _ = netnsutil.Sysctl(switchNs, "net.bridge.bridge-nf-call-iptables", "0")
		for i := 1; i <= n; i++ {
			port := "p" + strconv.Itoa(i)
			if _, err := netnsutil.Run(ctx, "", "ip", "link", "add", UnderlayDev, "netns", NodeName(i), "type", "veth", "peer", "name", port, "netns", switchNs); err != nil {
				return err
			}
			if err := runIn(ctx, switchNs, [][]string{{"ip", "link", "set", port, "master", "br0", "up"}}); err != nil {
				return err
			}
		}
	}
	rx := []int{c.Spec.RxCPU}
	for i := 1; i <= n; i++ {
		ns := NodeName(i)
		if err := runIn(ctx, ns, [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "addr", "add", netip.PrefixFrom(nodeAddr(i), underlayCIDR.Bits()).String(), "dev", UnderlayDev},
			{"ip", "link", "set", UnderlayDev, "up"},
			// A NIC's classic single-queue root qdisc (backpressure instead of drops; see
			// internal/lab's queue), wire-like frames (no TSO across the wire) and GRO on receive.
			{"tc", "qdisc", "replace", "dev", UnderlayDev, "root", "handle", "1:", "pfifo_fast"},
			{"ethtool", "-K", UnderlayDev, "tx", "off", "gro", "on"},
			// No default route (nothing may leave), and no dummy device (not in this kernel): a
			// route for the Service range, or a node's own connect() to a ClusterIP fails
			// before kube-proxy's OUTPUT rules see it.
			{"ip", "route", "add", ServiceCIDR.String(), "dev", UnderlayDev},
		}); err != nil {
			return err
		}
		// Receive like a NIC on its IRQ core: the NAPI poll (GRO) in a thread pinned there,
		// RPS to the same CPU (internal/lab's helpers, as `lab up --rx-cpus --napi-thread`).
		if err := lab.SetNAPIThread(ns, UnderlayDev, rx); err != nil {
			return err
		}
		if err := lab.SetRPS(ns, UnderlayDev, rx); err != nil {
			return err
		}
		for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.bridge.bridge-nf-call-iptables", "1"}, {"net.bridge.bridge-nf-call-ip6tables", "1"}} {
			if _, err := netnsutil.Sysctl(ns, kv[0], kv[1]); err != nil && !strings.Contains(kv[0], "bridge") {
				return err
			}
		}
		if err := c.makeMountNS(ctx, i); err != nil {
			return err
		}
		if err := makeCgroupRoot(i); err != nil {
			return err
		}
	}
	return nil
}

func runIn(ctx context.Context, ns string, cmds [][]string) error {
	for _, a := range cmds {
		if _, err := netnsutil.Run(ctx, ns, a...); err != nil {
			return err
		}
	}
	return nil
}

// madeMountPoints are the mount points makeMountNS needs on the host, parents first; those it
// creates, Down removes again (children first, and only while empty).
var madeMountPoints = []string{"/run/netns", "/run/peregrine", "/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/lib/cni"}

// makeMountNS gives node i a mount namespace of its own, kept by a bind mount of its file:
// a sysfs of the node's network namespace on /sys (the agent's rps knobs are the node's
// devices'), with the host's cgroup hierarchies and a bpffs of the node's own under it; tmpfs
// on /run/netns (the node's pods' namespaces), /run/peregrine (the agent's records),
// /var/log (kubelet's /var/log/containers), /var/lib/kubelet/device-plugins and /var/lib/cni. Everything
// is made private first, then rshared inside: the node's mounts reach its containers (HostToContainer) and never the host.
func (c *Cluster) makeMountNS(ctx context.Context, i int) error {
	f := MountNS(i)
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		return err
	}
	newsys := filepath.Join(c.nodeDir(i), "sys")
	if err := os.MkdirAll(newsys, 0o755); err != nil {
		return err
	}
	for _, d := range madeMountPoints {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			// A mount point must exist on the host; Down removes it again if the lab made it.
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			_ = os.WriteFile(filepath.Join(StateRoot, "made"+strings.ReplaceAll(d, "/", "_")), nil, 0o600)
		}
	}
	script := strings.Join([]string{
		"set -e",
		"mount -t sysfs -o rw,nosuid,nodev,noexec prg-k8s-sys " + newsys,
		"mount --rbind /sys/fs/cgroup " + newsys + "/fs/cgroup",
		"mount -t bpf -o mode=700 prg-k8s-bpf " + newsys + "/fs/bpf",
		"if mountpoint -q /sys/kernel/tracing; then mount --rbind /sys/kernel/tracing " + newsys + "/kernel/tracing; fi",
		"mount --move " + newsys + " /sys",
		"mount -t tmpfs -o mode=755 prg-k8s-netns /run/netns",
		"mount -t tmpfs -o mode=755 prg-k8s-run /run/peregrine",
		"mount -t tmpfs -o mode=755 prg-k8s-log /var/log",
		// kubelet binds its device plugin socket at a fixed path, whatever its --root-dir:
		// two nodes' kubelets starting together on the host's directory removed each
		// other's socket (bind: address already in use, kubelet exits).
		"mount -t tmpfs -o mode=755 prg-k8s-dp /var/lib/kubelet/device-plugins",
		// containerd's CNI library caches each attachment's result under /var/lib/cni (no
		// setting moves it): on the host's directory the nodes' caches outlived the lab.
		"mount -t tmpfs -o mode=700 prg-k8s-cni /var/lib/cni",
		"mkdir -p /var/log/containers /var/log/pods",
		// The host's copies of the other nodes' mount namespace files: a node must not hold
		// another's namespace alive.
		"umount -l " + filepath.Join(StateRoot, "mnt"),
		"mount --make-rshared /",
	}, "\n")
	// nsenter, not `ip netns exec`: that one starts from a mount namespace of its own with a
	// bare sysfs; this one starts from the host's.
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+netnsutil.Path(NodeName(i)), "--",
		"unshare", "--mount="+f, "--propagation", "private", "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node %d's mount namespace: %w: %s", i, err, out)
	}
	return nil
}
