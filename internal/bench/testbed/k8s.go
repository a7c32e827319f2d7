package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/lab/k8s"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// StyleK8s measures on the real Kubernetes lab (`peregrine lab up --style k8s`,
// internal/lab/k8s): between pods kubelet created, across flannel's VXLAN, through kube-proxy's
// own rules. Unlike the other styles, the bench does not build it: there is one cluster per
// machine, brought up beforehand, and every config of a run shares it. A config's modes are
// attached on every node just before each of its repetitions and detached before another
// config's, so repetitions stay interleaved across configs on the one cluster.
const StyleK8s = "k8s"

// IsK8s says whether a style runs on the Kubernetes lab.
func IsK8s(style string) bool { return style == StyleK8s }

// K8sService is the Service the bench creates for --via-service on the cluster: a ClusterIP
// whose one backend is the receiving pod (selected by the label the bench puts on it), the
// target port being where the measured server listens.
const (
	K8sService       = "prg-bench"
	k8sServiceLabel  = "prg-bench-role"
	k8sServicePort   = 80
	k8sServiceTarget = 47999
	// k8sNginxPort is where the nginx scenario listens in a web pod, whose busybox httpd has 8080.
	k8sNginxPort = 8088
)

// k8sNetnsPrefix names the pods' network namespaces as the bench attaches them (`ip netns
// attach`), so the workloads' `ip netns exec` and the probes find them by name. Under the
// cluster's own prefix: `lab down --name k8s` removes them too, after a bench killed with -9.
const k8sNetnsPrefix = k8s.Prefix + "bench-"

// K8sOptions are what a run asks of the cluster.
type K8sOptions struct {
	Background bool // a second pod pair (each node's second web pod) for background traffic
	SameNode   bool // the receiver is the sender's node's second pod
	ViaService bool // the client connects to Service prg-bench's ClusterIP
	RxCPUs     []int
	ModeCPUs   []int
	ToR        bool
}

// K8s is a run's hold on the cluster: the measured pods, what the bench created on the
// cluster (named namespaces, the Service), and which config's modes are attached now.
type K8s struct {
	Cluster *k8s.Cluster
	nodes   []string // the nodes' network namespaces the modes attach to (n1, n2)
	o       K8sOptions

	sender, receiver       lab.Node
	bgSender, bgReceiver   lab.Node
	recvNode               string // the receiving node's namespace
	named                  []string
	labelled               string // the pod labelled as the Service's backend
	service                bool
	connect                string
	serverPort             int
	active                 string   // the config whose modes are attached now ("" none)
	attached               []string // nodes with modes attached by us
	refs                   int
	log                    func(string, ...any)
	attachTook, detachTook time.Duration
	switches               int
}

// ErrNoK8sLab says what to do when no cluster is up.
var ErrNoK8sLab = errors.New("no k8s lab is up: bring one up first with `sudo peregrine lab up --style k8s --no-agent` " +
	"(about 20 s; --no-agent: the bench attaches each mode itself), and remove it afterwards with `sudo peregrine lab down --name k8s`")

// CheckK8s says whether a run may measure on the cluster that is up, before anything is
// changed: it is up and healthy, has the nodes the pair needs, and the bench may switch modes on
// them (no agent, nothing attached). It returns the cluster.
func CheckK8s(ctx context.Context, o K8sOptions) (*k8s.Cluster, error) {
	if o.ToR {
		return nil, errors.New("the k8s style takes no --tor (its nodes are joined by one veth pair)")
	}
	c, err := k8s.Load()
	if errors.Is(err, k8s.ErrNotUp) {
		return nil, ErrNoK8sLab
	}
	if err != nil {
		return nil, fmt.Errorf("k8s lab: %w", err)
	}
	if err := c.Healthy(ctx); err != nil {
		return nil, fmt.Errorf("the k8s lab is up but not healthy (%w): bring it up again (`sudo peregrine lab down --name k8s && sudo peregrine lab up --style k8s --no-agent`)", err)
	}
	if len(c.Nodes) < 2 && !o.SameNode {
		return nil, fmt.Errorf("the k8s lab has %d node: the bench measures from a pod on node 1 to one on node 2 (lab up --style k8s --nodes 2), or use --same-node", len(c.Nodes))
	}
	if rx := c.Spec.RxCPU; len(o.RxCPUs) > 0 && !slices.Equal(o.RxCPUs, []int{rx}) {
		return nil, fmt.Errorf("--rx-cpus %v: the k8s lab's receive CPU was set when it came up (lab up --style k8s --rx-cpu %d); leave --rx-cpus out, or bring the lab up with another --rx-cpu", o.RxCPUs, rx)
	}
	if err := checkNoAgent(ctx, c); err != nil {
		return nil, err
	}
	for _, n := range c.Nodes[:min(2, len(c.Nodes))] {
		sts, err := datapath.LoadStates(n.Name)
		if err != nil {
			return nil, err
		}
		for _, st := range sts {
			return nil, fmt.Errorf("mode %s is attached to node %s already: the bench attaches each config's modes itself; detach it first (`sudo peregrine detach --netns %s`)", st.Mode, n.Name, n.Name)
		}
		// An attachment made inside the node (the agent's, left by a DaemonSet deleted without
		// the documented cleanup) has no record here: its programs on the node's devices tell.
		if progs := peregrinePrograms(n.Name); len(progs) > 0 {
			return nil, fmt.Errorf("node %s has peregrine's programs attached (%s), not by this machine's CLI: the agent's, left by a DaemonSet deleted without its cleanup? Run `sudo peregrine lab exec --name k8s n%d -- peregrine uninstall`, or bring the lab up again with --no-agent",
				n.Name, strings.Join(progs, ", "), n.Index)
		}
	}
	return c, nil
}

// OpenK8s takes hold of the cluster that is up for a run: it checks it (CheckK8s), picks the
// pods and makes them reachable by name. On failure nothing it made is left.
func OpenK8s(ctx context.Context, o K8sOptions, log func(string, ...any)) (_ *K8s, err error) {
	c, err := CheckK8s(ctx, o)
	if err != nil {
		return nil, err
	}
	k := &K8s{Cluster: c, o: o, log: log}
	for _, n := range c.Nodes[:min(2, len(c.Nodes))] {
		k.nodes = append(k.nodes, n.Name)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.close())
		}
	}()
	pods, err := c.Pods(ctx, "default", "app=web")
	if err != nil {
		return nil, fmt.Errorf("k8s lab: list the web pods: %w", err)
	}
	pick, err := pickK8sPods(pods, k.nodes, o)
	if err != nil {
		return nil, err
	}
	nodesOf := map[string]lab.Node{}
	for _, p := range pick.all() {
		n, err := k.nameNetns(ctx, p)
		if err != nil {
			return nil, err
		}
		nodesOf[p.Name] = n
	}
	k.sender, k.receiver = nodesOf[pick.sender.Name], nodesOf[pick.receiver.Name]
	k.recvNode = pick.receiver.Node
	if o.Background {
		k.bgSender, k.bgReceiver = nodesOf[pick.bgSender.Name], nodesOf[pick.bgReceiver.Name]
	}
	if o.ViaService {
		if err := k.makeService(ctx, pick.receiver); err != nil {
			return nil, err
		}
	}
	log("k8s lab: measuring %s (%s, %s) -> %s (%s, %s)%s", pick.sender.Name, pick.sender.Node, pick.sender.IP,
		pick.receiver.Name, pick.receiver.Node, pick.receiver.IP, map[bool]string{true: " via ClusterIP " + k.connect}[o.ViaService])
	return k, nil
}

// checkNoAgent refuses a cluster where peregrine's DaemonSet runs: its agents keep fastpath
// attached on every node, so "vanilla" would not be vanilla, and they would fight the bench's
// attach and detach.
func checkNoAgent(ctx context.Context, c *k8s.Cluster) error {
	out, err := c.Kubectl(ctx, "-n", "kube-system", "get", "daemonset", "peregrine-agent", "--ignore-not-found", "-o", "name")
	if err != nil {
		return fmt.Errorf("k8s lab: is peregrine's agent installed? %w", err)
	}
	if strings.TrimSpace(out) != "" {
		return errors.New("the k8s lab runs peregrine's agent (DaemonSet kube-system/peregrine-agent): it keeps fastpath attached on every node, " +
			"so vanilla would not be vanilla, and the bench attaches each mode itself. Bring the lab up without it: " +
			"`sudo peregrine lab down --name k8s && sudo peregrine lab up --style k8s --no-agent`")
	}
	return nil
}

// k8sPick is the pods a run measures between.
type k8sPick struct {
	sender, receiver     k8s.Pod
	bgSender, bgReceiver k8s.Pod
	bg                   bool
}

func (p k8sPick) all() []k8s.Pod {
	out := []k8s.Pod{p.sender, p.receiver}
	if p.bg {
		out = append(out, p.bgSender, p.bgReceiver)
	}
	return out
}

// pickK8sPods picks the measured pair from the web pods (sorted by name within a node, so a
// run always takes the same ones): the sender is node 1's first pod, the receiver node 2's
// first (with SameNode, node 1's second); the background pair the nodes' second pods.
func pickK8sPods(pods []k8s.Pod, nodes []string, o K8sOptions) (k8sPick, error) {
	byNode := map[string][]k8s.Pod{}
	for _, p := range pods {
		byNode[p.Node] = append(byNode[p.Node], p)
	}
	for _, ps := range byNode {
		slices.SortFunc(ps, func(a, b k8s.Pod) int { return strings.Compare(a.Name, b.Name) })
	}
	need := func(node string, n int) ([]k8s.Pod, error) {
		if len(byNode[node]) < n {
			return nil, fmt.Errorf("k8s lab: want %d running web pods on %s, found %d (pods: %v); is the lab still coming up? (`peregrine lab kubectl -- get pods -o wide`)", n, node, len(byNode[node]), pods)
		}
		return byNode[node], nil
	}
	var pk k8sPick
	if len(nodes) == 0 {
		return pk, errors.New("k8s lab: no nodes")
	}
	perNode := 1
	if o.Background || o.SameNode {
		perNode = 2
	}
	a, err := need(nodes[0], perNode)
	if err != nil {
		return pk, err
	}
	pk.sender = a[0]
	if o.SameNode {
		if o.Background {
			return pk, errors.New("--same-node: no background pair (both of the node's pods are taken)")
		}
		pk.receiver = a[1]
		return pk, nil
	}
	if len(nodes) < 2 {
		return pk, errors.New("k8s lab: a second node is needed to measure across the overlay")
	}
	b, err := need(nodes[1], perNode)
	if err != nil {
		return pk, err
	}
	pk.receiver = b[0]
	if o.Background {
		pk.bg, pk.bgSender, pk.bgReceiver = true, a[1], b[1]
	}
	return pk, nil
}

// nameNetns makes a pod's network namespace (its sandbox's, found through the node's
// containerd) reachable by name: `ip netns attach` bind-mounts it under /run/netns.
func (k *K8s) nameNetns(ctx context.Context, p k8s.Pod) (lab.Node, error) {
	path, err := k.Cluster.PodNetns(ctx, "default", p.Name)
	if err != nil {
		return lab.Node{}, fmt.Errorf("k8s lab: pod %s's network namespace: %w", p.Name, err)
	}
	pid := strings.TrimSuffix(strings.TrimPrefix(path, "/proc/"), "/ns/net")
	if _, err := strconv.Atoi(pid); err != nil {
		return lab.Node{}, fmt.Errorf("k8s lab: pod %s: unexpected namespace path %q", p.Name, path)
	}
	name := k8sNetnsPrefix + p.Name
	_ = netnsutil.Delete(name) // left by a bench that was killed
	if _, err := netnsutil.Run(ctx, "", "ip", "netns", "attach", name, pid); err != nil {
		return lab.Node{}, fmt.Errorf("k8s lab: name pod %s's network namespace: %w", p.Name, err)
	}
	k.named = append(k.named, name)
	return lab.Node{Name: p.Name, Netns: name, Role: "container", Addr: p.IP + "/24"}, nil
}

// makeService labels the receiving pod and creates Service prg-bench selecting it alone, then
// waits until a connection through its ClusterIP reaches a listener in the pod: kube-proxy has
// written the rules.
func (k *K8s) makeService(ctx context.Context, recv k8s.Pod) error {
	c := k.Cluster
	if _, err := c.Kubectl(ctx, "label", "pod", recv.Name, k8sServiceLabel+"=receiver", "--overwrite"); err != nil {
		return fmt.Errorf("k8s lab: label pod %s: %w", recv.Name, err)
	}
	k.labelled = recv.Name
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec:
  selector: {%s: receiver}
  ports: [{port: %d, targetPort: %d}]
`, K8sService, k8sServiceLabel, k8sServicePort, k8sServiceTarget)
	if _, err := c.KubectlIn(ctx, manifest, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("k8s lab: create Service %s: %w", K8sService, err)
	}
	k.service = true
	ip, err := c.Kubectl(ctx, "get", "svc", K8sService, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	ip = strings.TrimSpace(ip)
	k.connect = net.JoinHostPort(ip, strconv.Itoa(k8sServicePort))
	k.serverPort = k8sServiceTarget
	var ln net.Listener
	if err := netnsutil.Do(k.receiver.Netns, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(recv.IP, strconv.Itoa(k8sServiceTarget)))
		return err
	}); err != nil {
		return fmt.Errorf("k8s lab: listen in %s: %w", recv.Name, err)
	}
	defer ln.Close()
	go func() {
		for {
			cn, err := ln.Accept()
			if err != nil {
				return
			}
			// The client closes first, so the TIME_WAIT is the sender pod's: one here would
			// keep a server that binds without SO_REUSEADDR (sockperf) off the port.
			go func() {
				_, _ = io.Copy(io.Discard, cn)
				cn.Close()
			}()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var derr error
		_ = netnsutil.Do(k.sender.Netns, func() error {
			var cn net.Conn
			cn, derr = net.DialTimeout("tcp", k.connect, time.Second)
			if derr == nil {
				cn.Close()
			}
			return nil
		})
		if derr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("k8s lab: Service %s (%s) does not reach pod %s after 30 s: %w", K8sService, k.connect, recv.Name, derr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Bed is one config's testbed on the cluster: nothing is attached until Activate.
func (k *K8s) Bed(ctx context.Context, s Spec) *Testbed {
	k.refs++
	tb := &Testbed{Config: s.Config, Knobs: map[string]string{}, k8s: k, stack: s.Stack,
		Sender: k.sender, Receiver: k.receiver, BGSender: k.bgSender, BGReceiver: k.bgReceiver,
		SenderHost: k.nodes[0], Connect: k.connect, ServerPort: k.serverPort, NginxPort: k8sNginxPort}
	recv := []lab.Node{{Name: k.recvNode, Netns: k.recvNode, Role: "host"}, k.receiver}
	tb.describeReceive(ctx, recv)
	return tb
}

// activate attaches tb's modes on every node, first detaching another config's.
func (k *K8s) activate(ctx context.Context, tb *Testbed) error {
	if k.active == tb.Config {
		return nil
	}
	if err := k.detach(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	for _, a := range tb.stack {
		for _, ns := range k.nodes {
			opts := datapath.Options{KeepUnderlay: true, CPUs: k.o.ModeCPUs, Extra: maps.Clone(a.Extra)}
			st, err := datapath.Attach(ctx, ns, a.Mode, opts)
			if err != nil {
				return errors.Join(fmt.Errorf("%s: attach %s on %s: %w", tb.Config, a.Mode, ns, err), k.detach(ctx))
			}
			if !slices.Contains(k.attached, ns) {
				k.attached = append(k.attached, ns)
			}
			// tb.Knobs is the map the run's config record holds: filled here, on first attach.
			for _, kn := range st.Knobs {
				tb.Knobs[kn.Netns+":"+kn.Path] = kn.New
			}
		}
	}
	tb.Attached = slices.Clone(k.attached)
	k.active = tb.Config
	if len(tb.stack) > 0 {
		k.attachTook += time.Since(t0)
		k.switches++
	}
	return nil
}

// detach removes whatever the bench attached on the nodes.
func (k *K8s) detach(ctx context.Context) error {
	var errs []error
	t0 := time.Now()
	for _, ns := range k.attached {
		if _, err := datapath.Detach(ctx, ns, ""); err != nil {
			errs = append(errs, fmt.Errorf("detach from %s: %w", ns, err))
		}
	}
	if len(k.attached) > 0 {
		k.detachTook += time.Since(t0)
	}
	k.attached, k.active = nil, ""
	return errors.Join(errs...)
}

// release is a bed's teardown: the last one detaches and removes what the bench made.
func (k *K8s) release() error {
	k.refs--
	if k.refs > 0 {
		return nil
	}
	if k.switches > 0 {
		k.log("k8s lab: %d mode switches, attach %s and detach %s on average (both nodes)", k.switches,
			(k.attachTook / time.Duration(k.switches)).Round(time.Millisecond), (k.detachTook / time.Duration(k.switches)).Round(time.Millisecond))
	}
	return k.close()
}

// close detaches and removes the names, the Service and the label, whatever happened before.
func (k *K8s) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := []error{k.detach(ctx)}
	if k.service {
		if _, err := k.Cluster.Kubectl(ctx, "delete", "svc", K8sService, "--ignore-not-found"); err != nil {
			errs = append(errs, fmt.Errorf("delete Service %s: %w", K8sService, err))
		}
		k.service = false
	}
	if k.labelled != "" {
		if _, err := k.Cluster.Kubectl(ctx, "label", "pod", k.labelled, k8sServiceLabel+"-"); err != nil {
			errs = append(errs, fmt.Errorf("unlabel pod %s: %w", k.labelled, err))
		}
		k.labelled = ""
	}
	for _, n := range k.named {
		errs = append(errs, netnsutil.Delete(n))
	}
	k.named = nil
	return errors.Join(errs...)
}

// Activate makes tb's config the one attached on its nodes (a no-op for every style but k8s,
// whose configs share one cluster). The runner calls it before each repetition.
func (tb *Testbed) Activate(ctx context.Context) error {
	if tb.k8s == nil {
		return nil
	}
	return tb.k8s.activate(ctx, tb)
}

// IsShared says whether the testbed shares its lab with the run's other configs (k8s): its
// modes come and go per repetition.
func (tb *Testbed) IsShared() bool { return tb.k8s != nil }

// peregrinePrograms lists the tcx programs named prg_* on any device of node namespace ns.
func peregrinePrograms(ns string) []string {
	var idx []int
	_ = netnsutil.Do(ns, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			idx = append(idx, l.Attrs().Index)
		}
		return err
	})
	var out []string
	for _, i := range idx {
		for _, egress := range []bool{false, true} {
			out = append(out, bpfobj.ProgramsOn(ns, i, egress, "prg_")...)
		}
	}
	return out
}
