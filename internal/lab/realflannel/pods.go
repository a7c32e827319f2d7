package realflannel

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Pods are made as a container runtime makes them: a namespace, then cnitool ADD run in the
// node's namespace (the plugins make the node side there: cni0, the veth, host-local's lease)
// with the node's own network config.

func (l *Lab) netconfDir(i int) string { return filepath.Join(l.nodeDir(i), "netconf") }

// netconf is node i's CNI network config: the flannel plugin reading that node's subnet file,
// delegating to bridge (cni0, the pod's default gateway) with host-local's leases kept in the
// lab's state directory rather than /var/lib/cni.
func (l *Lab) netconf(i int) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "0.3.1",
		"name":       NetName(l.Spec.Name),
		"type":       "flannel",
		"subnetFile": l.subnetFile(i),
		"dataDir":    filepath.Join(l.nodeDir(i), "flannel-cni"),
		"ipam":       map[string]any{"dataDir": filepath.Join(l.nodeDir(i), "host-local")},
		"delegate":   map[string]any{"hairpinMode": true, "isDefaultGateway": true},
	}, "", "  ")
}

func (l *Lab) writeNetconf(i int) error {
	b, err := l.netconf(i)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.netconfDir(i), 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(l.netconfDir(i), "10-flannel.conf"), b, 0o600)
}

// cni runs cnitool op (add, del) for pod namespace podNS on node i; addr, when valid, asks
// host-local for that address (CNI_ARGS IP=).
func (l *Lab) cni(ctx context.Context, op string, i int, podNS string, addr netip.Addr, out *[]byte) error {
	cmd := netnsutil.Command(ctx, nodeNetns(l.Spec.Name, i), l.Bin.CNITool, op, NetName(l.Spec.Name), netnsutil.Path(podNS))
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "CNI_") || strings.HasPrefix(e, "NETCONFPATH=") })
	env = append(env, "CNI_PATH="+l.Bin.FlannelCNI+":"+l.Bin.PluginDir, "NETCONFPATH="+l.netconfDir(i), "CNI_IFNAME=eth0")
	if addr.IsValid() {
		env = append(env, "CNI_ARGS=IgnoreUnknown=1;IP="+addr.String()) // the flannel plugin refuses args it does not know; host-local reads IP
	}
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	if out != nil {
		*out = b
	}
	if err != nil {
		return fmt.Errorf("cnitool %s %s on %s: %w: %s", op, podNS, nodeNetns(l.Spec.Name, i), err, strings.TrimSpace(string(b)))
	}
	return nil
}

var podNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// AddPod makes pod namespace prg-<lab>-n<node>-<name> and runs CNI ADD for it; addr, when
// valid, asks for that address (to recreate a deleted pod's address in a new namespace).
func (l *Lab) AddPod(ctx context.Context, node int, name string, addr netip.Addr) (*Pod, error) {
	if _, err := l.Node(node); err != nil {
		return nil, err
	}
	if !podNameRE.MatchString(name) {
		return nil, fmt.Errorf("pod name %q: want 1-8 lower-case letters and digits, starting with a letter", name)
	}
	ns := fmt.Sprintf("%s-%s", nodeNetns(l.Spec.Name, node), name)
	if netnsutil.Exists(ns) {
		return nil, fmt.Errorf("pod %s exists", ns)
	}
	if err := netnsutil.Create(ns); err != nil {
		return nil, err
	}
	if _, err := netnsutil.Run(ctx, ns, "ip", "link", "set", "lo", "up"); err != nil {
		_ = netnsutil.Delete(ns)
		return nil, err
	}
	var out []byte
	if err := l.cni(ctx, "add", node, ns, addr, &out); err != nil {
		// A half-done ADD is undone by DEL, as a runtime does.
		_ = l.cni(ctx, "del", node, ns, netip.Addr{}, nil)
		_ = netnsutil.Delete(ns)
		return nil, err
	}
	got, err := resultAddr(out)
	if err != nil {
		_ = l.cni(ctx, "del", node, ns, netip.Addr{}, nil)
		_ = netnsutil.Delete(ns)
		return nil, fmt.Errorf("CNI ADD %s: %w", ns, err)
	}
	p := Pod{Name: name, Netns: ns, Node: node, Addr: got}
	l.Pods = append(l.Pods, p)
	return &l.Pods[len(l.Pods)-1], nil
}

// resultAddr reads the pod's IPv4 address from a CNI result (any version: "ips" entries).
func resultAddr(out []byte) (netip.Addr, error) {
	// cnitool prints the result; the plugins may log before it, so take the JSON object.
	start := strings.IndexByte(string(out), '{')
	if start < 0 {
		return netip.Addr{}, fmt.Errorf("no CNI result in %q", out)
	}
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out[start:], &r); err != nil {
		return netip.Addr{}, fmt.Errorf("CNI result: %w", err)
	}
	for _, ip := range r.IPs {
		if p, err := netip.ParsePrefix(ip.Address); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("CNI result has no IPv4 address: %s", out[start:])
}

// DelPod runs CNI DEL for a pod and removes its namespace.
func (l *Lab) DelPod(ctx context.Context, netns string) error {
	idx := slices.IndexFunc(l.Pods, func(p Pod) bool { return p.Netns == netns })
	if idx < 0 {
		return fmt.Errorf("no pod %s in lab %s", netns, l.Spec.Name)
	}
	p := l.Pods[idx]
	if err := l.cni(ctx, "del", p.Node, p.Netns, netip.Addr{}, nil); err != nil {
		return err
	}
	if err := netnsutil.Delete(p.Netns); err != nil {
		return err
	}
	l.Pods = slices.Delete(l.Pods, idx, idx+1)
	return nil
}

// Pod returns the pod in namespace netns.
func (l *Lab) Pod(netns string) (*Pod, error) {
	for i := range l.Pods {
		if l.Pods[i].Netns == netns {
			return &l.Pods[i], nil
		}
	}
	return nil, fmt.Errorf("no pod %s in lab %s", netns, l.Spec.Name)
}

// NodeNetns are the node namespaces, where the datapath modes attach.
func (l *Lab) NodeNetns() []string {
	var out []string
	for _, n := range l.Nodes {
		out = append(out, n.Netns)
	}
	return out
}
