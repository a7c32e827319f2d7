package realflannel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/proc"
)

// StateRoot holds every lab's run-time state, one directory per lab.
const StateRoot = "/run/peregrine/realflannel"

// Addresses: the underlay is one L2 segment; node i has 10.250.0.i. Two nodes are joined by a
// veth pair, eth0 to eth0, as two NICs on a cable, and etcd listens on node 1's address (a
// control-plane node). More nodes share a bridge in the prg-<name>-ul namespace, where etcd
// listens on .254. flannel hands out /24s of 10.244.0.0/16.
var (
	underlayCIDR = netip.MustParsePrefix("10.250.0.0/24")
	ulEtcdAddr   = netip.MustParseAddr("10.250.0.254")
	// FlannelNetwork is the overlay's address range (flannel's "Network").
	FlannelNetwork = netip.MustParsePrefix("10.244.0.0/16")
)

// UnderlayDev is each node's underlay device, named as peregrine's own lab names it (the bench
// probes calibrate on a host's eth0).
const UnderlayDev = "eth0"

// Spec is what to bring up.
type Spec struct {
	Name  string // the lab's name: namespaces prg-<Name>-*
	Nodes int    // node namespaces prg-<Name>-n1..nN
	Pods  int    // pods per node, prg-<Name>-nI-p1..pK, made by CNI ADD
	// NoUDPCsum gives flannel.1 zero outer UDP checksums (noudpcsum) instead of the kernel's
	// default that flanneld leaves (udpcsum: the outer checksum computed per segment): the lab
	// makes flannel.1 before flanneld starts, as flanneld would but for that flag, and flanneld
	// keeps a compatible device. For measuring what the checksum costs; flannel itself has no
	// such setting.
	NoUDPCsum bool
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

// Validate refuses a spec that would make names the kernel refuses or a lab too big for a
// machine of namespaces.
func (s Spec) Validate() error {
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("lab name %q: want 1-10 lower-case letters and digits, starting with a letter", s.Name)
	}
	if s.Nodes < 1 || s.Nodes > 16 {
		return fmt.Errorf("--nodes %d: want 1 to 16", s.Nodes)
	}
	if s.Pods < 0 || s.Pods > 32 {
		return fmt.Errorf("--pods %d: want 0 to 32 per node", s.Pods)
	}
	return nil
}

// Prefix is the prefix of every namespace of the named lab.
func Prefix(name string) string { return "prg-" + name + "-" }

// NetName is the CNI network's name (host-local's and cnitool's cache are keyed by it).
func NetName(name string) string { return "prg-" + name }

// Node is one node namespace.
type Node struct {
	Index    int
	Netns    string
	Underlay netip.Addr
	Subnet   netip.Prefix // the /24 flannel leased to it (from its subnet file)
}

// Pod is one pod namespace, made by CNI ADD on a node.
type Pod struct {
	Name  string // pJ
	Netns string
	Node  int
	Addr  netip.Addr
}

// Lab is a lab that is up.
type Lab struct {
	Spec  Spec
	Bin   Binaries
	Dir   string
	Nodes []Node
	Pods  []Pod
}

// Dir is the named lab's state directory.
func Dir(name string) string { return filepath.Join(StateRoot, name) }

func (l *Lab) nodeDir(i int) string { return filepath.Join(l.Dir, "n"+strconv.Itoa(i)) }
func (l *Lab) ulNetns() string      { return Prefix(l.Spec.Name) + "ul" }

// Direct says whether the underlay is one veth pair between the two nodes (no bridge, no third
// namespace): what a 2-node lab gets, so a benchmark on it measures flannel and not a software
// switch. More nodes need a switch and share a bridge.
func (s Spec) Direct() bool { return s.Nodes == 2 }

// etcdNetns is where etcd runs and listens: node 1 on a direct underlay, else the bridge's namespace.
func (l *Lab) etcdNetns() string {
	if l.Spec.Direct() {
		return nodeNetns(l.Spec.Name, 1)
	}
	return l.ulNetns()
}

// etcdAddr is etcd's only client address, reachable from every node over the underlay.
func (l *Lab) etcdAddr() netip.Addr {
	if l.Spec.Direct() {
		return nthAddr(underlayCIDR, 1)
	}
	return ulEtcdAddr
}
func nodeNetns(name string, i int) string { return fmt.Sprintf("%sn%d", Prefix(name), i) }

// Node returns node i (from 1).
func (l *Lab) Node(i int) (*Node, error) {
	if i < 1 || i > len(l.Nodes) {
		return nil, fmt.Errorf("no node %d (the lab has %d)", i, len(l.Nodes))
	}
	return &l.Nodes[i-1], nil
}

// Up brings up the lab. Anything a failed or interrupted run of the same name left is removed
// first; on failure everything is removed again.
func Up(ctx context.Context, s Spec, log func(string, ...any)) (l *Lab, err error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	bin := DefaultBinaries()
	if m := bin.Missing(); len(m) > 0 {
		return nil, fmt.Errorf("real flannel lab: missing %s; run scripts/setup.sh as root", strings.Join(m, "; "))
	}
	if err := Down(s.Name); err != nil {
		return nil, fmt.Errorf("remove what an earlier run of %s left: %w", s.Name, err)
	}
	l = &Lab{Spec: s, Bin: bin, Dir: Dir(s.Name)}
	defer func() {
		if err != nil {
			if derr := Down(s.Name); derr != nil {
				err = errors.Join(err, fmt.Errorf("and tearing down: %w", derr))
			}
			l = nil
		}
	}()
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, err
	}
	if b, err := json.Marshal(s); err == nil {
		_ = os.WriteFile(filepath.Join(l.Dir, "spec.json"), b, 0o600)
	}
	// cnitool caches its results under libcni's CacheDir and has no setting to move it: if the
	// directory is not there yet, the lab makes it, and Down takes it away again.
	if _, err := os.Stat(cniCacheDir); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(filepath.Join(l.Dir, cniCacheMarker), nil, 0o600); err != nil {
			return nil, err
		}
	}
	if s.Direct() {
		log("underlay: %s and %s joined by a veth pair (eth0 to eth0)", nodeNetns(s.Name, 1), nodeNetns(s.Name, 2))
	} else {
		log("underlay: bridge in %s and %d node namespaces", l.ulNetns(), s.Nodes)
	}
	if err := l.buildUnderlay(ctx); err != nil {
		return nil, err
	}
	log("etcd %s on %s:2379 in %s", etcdVersion(ctx, bin.Etcd), l.etcdAddr(), l.etcdNetns())
	if err := l.startEtcd(ctx); err != nil {
		return nil, err
	}
	log("flanneld %s (vxlan) on every node", FlannelVersion)
	for i := 1; i <= s.Nodes; i++ {
		if err := l.startFlanneld(ctx, i); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= s.Nodes; i++ {
		if err := l.waitLease(ctx, i, time.Time{}); err != nil {
			return nil, err
		}
	}
	if err := l.waitRoutes(ctx); err != nil {
		return nil, err
	}
	for i := 1; i <= s.Nodes; i++ {
		if err := l.writeNetconf(i); err != nil {
			return nil, err
		}
	}
	if s.Pods > 0 {
		log("%d pods per node by CNI ADD (flannel -> bridge + host-local)", s.Pods)
	}
	for i := 1; i <= s.Nodes; i++ {
		for j := 1; j <= s.Pods; j++ {
			if _, err := l.AddPod(ctx, i, "p"+strconv.Itoa(j), netip.Addr{}); err != nil {
				return nil, err
			}
		}
	}
	if s.Nodes > 1 && s.Pods > 0 {
		a, b := l.Pods[0], l.Pods[len(l.Pods)-1]
		if err := Ping(ctx, a.Netns, b.Addr, 10*time.Second); err != nil {
			return nil, fmt.Errorf("the overlay does not carry %s -> %s: %w", a.Netns, b.Netns, err)
		}
	}
	return l, nil
}

// buildUnderlay makes every node namespace with its eth0 on the underlay: for two nodes a veth
// pair between them, for more a bridge in a third namespace. eth0 behaves like a NIC (nicLike).
func (l *Lab) buildUnderlay(ctx context.Context) error {
	for i := 1; i <= l.Spec.Nodes; i++ {
		if err := netnsutil.Create(nodeNetns(l.Spec.Name, i)); err != nil {
			return err
		}
	}
	if l.Spec.Direct() {
		n1, n2 := nodeNetns(l.Spec.Name, 1), nodeNetns(l.Spec.Name, 2)
		if err := runAll(ctx, "", [][]string{{"ip", "link", "add", UnderlayDev, "netns", n1, "type", "veth", "peer", "name", UnderlayDev, "netns", n2}}); err != nil {
			return err
		}
	} else if err := l.bridgeUnderlay(ctx); err != nil {
		return err
	}
	for i := 1; i <= l.Spec.Nodes; i++ {
		ns := nodeNetns(l.Spec.Name, i)
		addr := nthAddr(underlayCIDR, i)
		if err := runAll(ctx, ns, [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "addr", "add", netip.PrefixFrom(addr, underlayCIDR.Bits()).String(), "dev", UnderlayDev},
			{"ip", "link", "set", UnderlayDev, "up"},
		}); err != nil {
			return err
		}
		if err := nicLike(ctx, ns); err != nil {
			return err
		}
		if _, err := netnsutil.Sysctl(ns, "net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		l.Nodes = append(l.Nodes, Node{Index: i, Netns: ns, Underlay: addr})
	}
	return nil
}

// nicLike makes a node's eth0 behave as peregrine's own lab makes its hosts' (internal/lab's
// underlay): GRO on, which puts the veth in NAPI mode, so frames arrive through a NAPI poll with
// GRO as from a NIC, not one by one through the per-CPU backlog; a pfifo_fast root qdisc, a
// single-queue NIC's default, so a full peer ring pushes back instead of dropping; transmit
// checksumming off, so every checksum is on the wire as a NIC's offload would have written it.
// Where receive runs (the emulated IRQ core) is the benchmark's choice: lab.SetRPS and
// lab.SetNAPIThread on eth0.
func nicLike(ctx context.Context, ns string) error {
	if _, err := netnsutil.Run(ctx, ns, "ethtool", "-K", UnderlayDev, "tx", "off", "gro", "on"); err != nil {
		return fmt.Errorf("%s: GRO on and tx checksumming off on %s: %w", ns, UnderlayDev, err)
	}
	if _, err := netnsutil.Run(ctx, ns, "tc", "qdisc", "replace", "dev", UnderlayDev, "root", "pfifo_fast"); err != nil {
		return fmt.Errorf("%s: pfifo_fast root qdisc on %s: %w", ns, UnderlayDev, err)
	}
	return nil
}

// bridgeUnderlay makes the underlay namespace with its bridge and puts every node's eth0 on it
// (three nodes or more).
func (l *Lab) bridgeUnderlay(ctx context.Context) error {
	ul := l.ulNetns()
	if err := netnsutil.Create(ul); err != nil {
		return err
	}
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "addr", "add", netip.PrefixFrom(ulEtcdAddr, underlayCIDR.Bits()).String(), "dev", "br0"},
		{"ip", "link", "set", "br0", "up"},
	}
	if err := runAll(ctx, ul, cmds); err != nil {
		return err
	}
	// A loaded br_netfilter would send the underlay's bridged frames through this namespace's
	// iptables; the underlay is a wire.
	_, _ = netnsutil.Sysctl(ul, "net.bridge.bridge-nf-call-iptables", "0")
	for i := 1; i <= l.Spec.Nodes; i++ {
		port := "n" + strconv.Itoa(i)
		if err := runAll(ctx, "", [][]string{{"ip", "link", "add", UnderlayDev, "netns", nodeNetns(l.Spec.Name, i), "type", "veth", "peer", "name", port, "netns", ul}}); err != nil {
			return err
		}
		if err := runAll(ctx, ul, [][]string{{"ip", "link", "set", port, "master", "br0", "up"}}); err != nil {
			return err
		}
		if err := wireFIFO(ul, port); err != nil {
			return err
		}
	}
	return nil
}

// wireFIFO steers everything a node sends into the underlay through one CPU's queue. Without it
// a frame sent from CPU 0 (TCP answering an ACK in softirq) and one sent from CPU 1 (the
// application) wait in two CPUs' backlogs of the bridge port (veth's netif_rx) and can swap
// places: a reordering hop that a NIC's transmit ring and a wire do not have. Measured on one
// TCP flow: the receiver's out-of-order queueing fell 2-7x, retransmits 4-10x (docs/results.md).
func wireFIFO(ns, port string) error {
	return netnsutil.WithSysfs(ns, func() error {
		p := "/sys/class/net/" + port + "/queues/rx-0/rps_cpus"
		if err := os.WriteFile(p, []byte(cpuMask(runtime.NumCPU()-1)), 0o644); err != nil {
			return fmt.Errorf("%s: one receive queue for underlay port %s: %w", ns, port, err)
		}
		return nil
	})
}

// cpuMask is the RPS mask (comma-separated 32-bit words, most significant first) of CPU n. The
// lab uses the highest-numbered CPU: the benchmarks keep CPU 0 for the nodes' receive, so the
// underlay's forwarding lands beside the sender, as on peregrine's own lab where the receiving
// veth's NAPI runs on the sending CPU.
func cpuMask(n int) string {
	words := make([]string, n/32+1)
	for i := range words {
		words[i] = "00000000"
	}
	words[0] = fmt.Sprintf("%x", uint32(1)<<(n%32))
	return strings.Join(words, ",")
}

func runAll(ctx context.Context, ns string, cmds [][]string) error {
	for _, c := range cmds {
		if _, err := netnsutil.Run(ctx, ns, c...); err != nil {
			return err
		}
	}
	return nil
}

// nthAddr is the n-th address of p.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// readSubnetFile reads FLANNEL_SUBNET (the node's gateway address with the /24's length).
func readSubnetFile(path string) (netip.Prefix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "FLANNEL_SUBNET="); ok {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return netip.Prefix{}, fmt.Errorf("%s: FLANNEL_SUBNET %q: %w", path, v, err)
			}
			return p.Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s: no FLANNEL_SUBNET", path)
}

// waitRoutes waits until every node routes every other node's subnet over flannel.1, i.e.
// each flanneld has seen every other's lease.
func (l *Lab) waitRoutes(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range l.Nodes {
		for _, m := range l.Nodes {
			if m.Index == n.Index {
				continue
			}
			for {
				out, _ := netnsutil.Run(ctx, n.Netns, "ip", "-4", "route", "show", m.Subnet.String(), "dev", "flannel.1")
				if strings.TrimSpace(out) != "" {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s has no route to %s (%s's subnet) after 20 s: see %s", n.Netns, m.Subnet, m.Netns, l.flanneldLog(n.Index))
				}
				if err := sleep(ctx, 100*time.Millisecond); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// Ping waits until from reaches to (one echo), for at most d.
func Ping(ctx context.Context, from string, to netip.Addr, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		out, err := netnsutil.Run(ctx, from, "ping", "-c", "1", "-W", "1", to.String())
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ping %s from %s: %w\n%s", to, from, err, out)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// Down removes the named lab: CNI DEL for every pod still there, every process it started
// (pid files, then whatever still runs in its namespaces), the namespaces, etcd's data and the
// CNI state. A lab that is not up is not an error; what is left after is.
func Down(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("lab name %q: want 1-10 lower-case letters and digits, starting with a letter", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := &Lab{Spec: Spec{Name: name}, Bin: DefaultBinaries(), Dir: Dir(name)}
	var errs []error
	nss, err := netnsutil.List(Prefix(name))
	if err != nil {
		return err
	}
	// Pods first, while their node's bridge and the CNI state are there: DEL releases the
	// address and removes the veth as a runtime would.
	for _, ns := range nss {
		node, pod, ok := parsePodNetns(name, ns)
		if !ok {
			continue
		}
		if _, err := os.Stat(l.netconfDir(node)); err == nil {
			if err := l.cni(ctx, "del", node, ns, netip.Addr{}, nil); err != nil {
				errs = append(errs, fmt.Errorf("CNI DEL %s: %w", pod, err))
			}
		}
	}
	errs = append(errs, l.killAll()...)
	for _, ns := range nss {
		if ino, err := netnsutil.Inode(netnsutil.Path(ns)); err == nil {
			proc.KillAll(netnsutil.PIDsIn(ino))
		}
		if err := netnsutil.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	_, err = os.Stat(filepath.Join(l.Dir, cniCacheMarker))
	madeCache := err == nil
	if err := os.RemoveAll(l.Dir); err != nil {
		errs = append(errs, err)
	}
	// cnitool's result cache (libcni's default cache directory): <net>-<container id>-<ifname>.
	res, _ := filepath.Glob(filepath.Join(cniCacheDir, "results", NetName(name)+"-*"))
	for _, r := range res {
		if err := os.Remove(r); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// The directories themselves go only if this lab made them and nothing else is in them
	// (another lab still up, or a CNI installed since, keeps them: Remove refuses a non-empty one).
	if madeCache {
		for _, d := range []string{filepath.Join(cniCacheDir, "results"), cniCacheDir} {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
				errs = append(errs, err)
			}
		}
	}
	if left, _ := netnsutil.List(Prefix(name)); len(left) > 0 {
		errs = append(errs, fmt.Errorf("namespaces left: %s", strings.Join(left, " ")))
	}
	return errors.Join(errs...)
}

// cniCacheDir is libcni's default cache directory, where cnitool keeps its results.
const cniCacheDir = "/var/lib/cni"

// cniCacheMarker, in the lab's state directory, records that the lab made cniCacheDir.
const cniCacheMarker = "made-var-lib-cni"

// DownAll removes every real flannel lab that has a state directory.
func DownAll(log func(string, ...any)) error {
	entries, err := os.ReadDir(StateRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !nameRE.MatchString(e.Name()) {
			continue
		}
		log("removing real flannel lab %s", e.Name())
		errs = append(errs, Down(e.Name()))
	}
	return errors.Join(errs...)
}

// parsePodNetns reads prg-<name>-n<I>-<pod>.
func parsePodNetns(name, ns string) (node int, pod string, ok bool) {
	rest, ok := strings.CutPrefix(ns, Prefix(name)+"n")
	if !ok {
		return 0, "", false
	}
	num, pod, ok := strings.Cut(rest, "-")
	if !ok || pod == "" {
		return 0, "", false
	}
	node, err := strconv.Atoi(num)
	if err != nil || node < 1 {
		return 0, "", false
	}
	return node, pod, true
}
