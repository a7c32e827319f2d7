// Package k8s brings up a real Kubernetes cluster on this machine: Kubernetes v1.31.14 built
// from source (scripts/setup-k8s.sh), one node per network namespace prg-k8s-n1..nN, each with
// its own containerd, kubelet, kube-proxy, flanneld (--kube-subnet-mgr, VXLAN) and kube-router
// (NetworkPolicy only), the control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) on node 1. Pods are made by kubelet through the CRI and the flannel CNI plugin;
// Services are kube-proxy's own rules. peregrine itself is installed as users install it: its
// image imported into every node's containerd and deploy/kubernetes applied through the lab's
// kustomize overlay (deploy/kubernetes-lab).
//
// One machine is not N machines, and the lab makes up the difference so that the machine is
// left as it was:
//   - every node has its own mount namespace (a file under the state directory), in which the
//     node has its own bpffs on /sys/fs/bpf, its own /run/peregrine, /run/netns and /var/log
//     (tmpfs): the agents of two nodes never share pins or records, kubelet's and containerd's
//     mounts never reach the host, and /var/log/containers is the node's;
//   - cgroup v1 without systemd: kubelet uses cgroupfs under its own cgroupRoot /prg-k8s-nI;
//   - kubelet writes global sysctls (vm.overcommit_memory, kernel.panic, ...): they are saved
//     on up and restored on down;
//   - the bounding set lacks CAP_SYS_RESOURCE: containerd clamps oom_score_adj
//     (restrict_oom_score_adj) and the lab's overlay drops that capability from the agent.
//
// Run-time state (certificates, configs, logs, pid files, containerd's and kubelet's data) is in
// /run/prg-k8s; Down removes it with every process, mount, namespace and cgroup.
package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Name is the cluster's name: one cluster per machine (its ports and paths are fixed).
const Name = "k8s"

// StateRoot holds the cluster's run-time state.
const StateRoot = "/run/prg-k8s"

// Prefix is the prefix of every namespace and cgroup of the cluster.
const Prefix = "prg-k8s-"

var (
	underlayCIDR = netip.MustParsePrefix("198.18.0.0/24")
	// PodCIDR is flannel's network; each node gets a /24 of it from the controller-manager.
	PodCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// ServiceCIDR is the Services' range; the apiserver's own ClusterIP is its first address.
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
)

// Proxy modes kube-proxy runs in.
const (
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
)

// Spec is what to bring up.
type Spec struct {
	Nodes         int    `json:"nodes"`
	ProxyMode     string `json:"proxy_mode"`
	NetworkPolicy bool   `json:"network_policy"` // run kube-router's policy controller on every node
	// Agent installs peregrine as its DaemonSet (deploy/kubernetes through deploy/kubernetes-lab)
	// with the image built from AgentBinary (a static peregrine) and Repo's deploy/ files.
	Agent       bool   `json:"agent"`
	AgentBinary string `json:"agent_binary,omitempty"`
	Repo        string `json:"repo,omitempty"` // the peregrine source tree (deploy/)
	RxCPU       int    `json:"rx_cpu"`         // the underlay's receive (NAPI thread, RPS) runs here: the NIC's IRQ core
	// Forget is the datapath's cleanup that Down runs for what an earlier cluster left (see Down).
	Forget lab.Forget `json:"-"`
}

// Validate refuses a spec before anything is changed.
func (s *Spec) Validate() error {
	if s.Nodes < 1 || s.Nodes > 8 {
		return fmt.Errorf("--nodes %d: want 1 to 8 (each node is a kubelet, a containerd and ~300 MB)", s.Nodes)
	}
	switch s.ProxyMode {
	case "":
		s.ProxyMode = ProxyIPTables
	case ProxyIPTables, ProxyNFTables:
	default:
		return fmt.Errorf("--proxy-mode %q: want iptables or nftables", s.ProxyMode)
	}
	if s.Agent {
		if s.AgentBinary == "" {
			return errors.New("the agent needs a static peregrine binary (CGO_ENABLED=0 go build -o bin/peregrine ./cmd/peregrine)")
		}
		if err := checkStatic(s.AgentBinary); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(s.Repo, "deploy", "kubernetes-lab", "kustomization.yaml")); err != nil {
			return fmt.Errorf("the agent's manifests: %w (run from peregrine's source tree, or --repo DIR)", err)
		}
	}
	if s.RxCPU < 0 {
		return fmt.Errorf("rx cpu %d: want a CPU number", s.RxCPU)
	}
	return nil
}

// Node is one node of the cluster.
type Node struct {
	Index   int        `json:"index"`
	Name    string     `json:"name"` // the Kubernetes node name, also its network namespace
	Addr    netip.Addr `json:"addr"` // on the underlay (eth0)
	PodCIDR string     `json:"pod_cidr,omitempty"`
}

// Cluster is a cluster that is up.
type Cluster struct {
	Spec  Spec      `json:"spec"`
	Bin   Binaries  `json:"-"`
	Dir   string    `json:"dir"`
	Nodes []Node    `json:"nodes"`
	Since time.Time `json:"since"`
	Took  string    `json:"took,omitempty"`
	pki   *pki
}

// NodeName is node i's name and network namespace.
func NodeName(i int) string { return Prefix + "n" + strconv.Itoa(i) }

func nodeAddr(i int) netip.Addr {
	b := underlayCIDR.Addr().As4()
	b[3] = byte(i)
	return netip.AddrFrom4(b)
}

// APIServer is the apiserver's address (node 1's).
func APIServer() netip.Addr { return nodeAddr(1) }

func (c *Cluster) nodeDir(i int) string { return filepath.Join(c.Dir, "n"+strconv.Itoa(i)) }

// MountNS is node i's mount namespace file.
func MountNS(i int) string { return filepath.Join(StateRoot, "mnt", "n"+strconv.Itoa(i)) }

// Kubeconfig is the admin's kubeconfig (use it from a node's network namespace).
func Kubeconfig() string { return filepath.Join(StateRoot, "pki", "admin.kubeconfig") }

func specPath() string { return filepath.Join(StateRoot, "cluster.json") }

// Load reads the cluster that is up (ErrNotUp if none).
func Load() (*Cluster, error) {
	b, err := os.ReadFile(specPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotUp
	}
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%s: %w", specPath(), err)
	}
	c.Bin = DefaultBinaries()
	return c, nil
}

// ErrNotUp says no cluster is up.
var ErrNotUp = errors.New("the k8s lab is not up (peregrine lab up --style k8s)")

func (c *Cluster) save() error {
	b, _ := json.MarshalIndent(c, "", "  ")
	return os.WriteFile(specPath(), b, 0o600)
}

// Up brings up the cluster; anything an earlier run left is removed first, and everything is
// removed again on failure.
func Up(ctx context.Context, s Spec, log func(string, ...any)) (c *Cluster, err error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	bin := DefaultBinaries()
	m := bin.Missing()
	if !s.NetworkPolicy { // kube-router is needed only for NetworkPolicy
		m = slices.DeleteFunc(m, func(x string) bool { return strings.Contains(x, "kube-router") })
	}
	if len(m) > 0 {
		return nil, fmt.Errorf("k8s lab: missing %s; run scripts/setup.sh as root", strings.Join(m, "; "))
	}
	if s.RxCPU >= numCPU() {
		return nil, fmt.Errorf("rx cpu %d: this machine has %d CPUs", s.RxCPU, numCPU())
	}
	closeInheritedFDs()
	if err := Down(log, s.Forget); err != nil {
		return nil, fmt.Errorf("remove what an earlier cluster left: %w", err)
	}
	t0 := time.Now()
	c = &Cluster{Spec: s, Bin: bin, Dir: StateRoot, Since: t0}
	defer func() {
		if err != nil {
			log("bring-up failed; removing the cluster (logs were in %s)", StateRoot)
			if keep := os.Getenv("PEREGRINE_K8S_KEEP_FAILED"); keep != "" {
				return
			}
			if derr := Down(nil, s.Forget); derr != nil {
				err = errors.Join(err, fmt.Errorf("and tearing down: %w", derr))
			}
			c = nil
		}
	}()
	if err := c.prepareHost(); err != nil {
		return nil, err
	}
	for i := 1; i <= s.Nodes; i++ {
		c.Nodes = append(c.Nodes, Node{Index: i, Name: NodeName(i), Addr: nodeAddr(i)})
	}
	if err := c.save(); err != nil {
		return nil, err
	}
	log("%d node namespaces, underlay %s, each with its own mount namespace", s.Nodes, underlayCIDR)
	if err := c.buildNodes(ctx); err != nil {
		return nil, err
	}
	var names []string
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	c.pki, err = newPKI(filepath.Join(c.Dir, "pki"), "https://"+net.JoinHostPort(APIServer().String(), "6443"))
	if err != nil {
		return nil, fmt.Errorf("PKI: %w", err)
	}
	if err := c.pki.makeAll(net.IP(APIServer().AsSlice()), net.IP(nthAddr(ServiceCIDR, 1).AsSlice()), names); err != nil {
		return nil, fmt.Errorf("PKI: %w", err)
	}
	log("etcd, containerd on every node (images imported), kube-apiserver %s", KubernetesVersion)
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- c.startAPIServer(ctx) }()
	if err := c.startContainerds(ctx); err != nil {
		<-errc
		return nil, err
	}
	if err := <-errc; err != nil {
		return nil, err
	}
	if err := c.startControllers(ctx); err != nil {
		return nil, err
	}
	if err := c.applyBase(ctx); err != nil {
		return nil, err
	}
	log("kubelet, kube-proxy (%s), flanneld%s on every node", s.ProxyMode, map[bool]string{true: ", kube-router (NetworkPolicy)"}[s.NetworkPolicy])
	for i := 1; i <= s.Nodes; i++ {
		if err := c.startKubelet(i); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= s.Nodes; i++ {
		if err := c.startNodeNet(ctx, i); err != nil {
			return nil, err
		}
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	log("test workloads: Deployment web (%d pods, busybox httpd), Services web (ClusterIP) and web-np (NodePort %d)", 2*s.Nodes, WebNodePort)
	if err := c.applyWorkloads(ctx); err != nil {
		return nil, err
	}
	if s.Agent {
		log("peregrine: image %s into every node, deploy/kubernetes-lab applied", PeregrineImage)
		if err := c.InstallAgent(ctx, PeregrineImage); err != nil {
			return nil, err
		}
	}
	if err := c.waitWorkloads(ctx); err != nil {
		return nil, err
	}
	log("checking pod to pod (same node, across VXLAN) and pod to ClusterIP")
	if err := c.Verify(ctx); err != nil {
		return nil, err
	}
	c.Took = time.Since(t0).Round(100 * time.Millisecond).String()
	return c, c.save()
}

func nthAddr(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// waitFor polls ok every step until it holds or d passes; the error says what was awaited and
// the last reason.
func waitFor(ctx context.Context, d, step time.Duration, what string, ok func() (bool, error)) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		done, err := ok()
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("%s: not after %s: %w", what, d, last)
			}
			return fmt.Errorf("%s: not after %s", what, d)
		}
		if err := sleep(ctx, step); err != nil {
			return err
		}
	}
}

// Exec runs argv on node i (its network and mount namespace), with the given stdio.
func Exec(ctx context.Context, i int, argv ...string) *execCmd {
	return nodeCommand(ctx, i, argv...)
}

var _ = netnsutil.Path
