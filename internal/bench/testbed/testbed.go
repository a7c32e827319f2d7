// Package testbed builds what a benchmark measures on: the lab of one config with its modes
// attached, or existing namespaces taken as found, and takes it down again. It knows nothing of
// scenarios or results: the runner (internal/bench) says what to build and measures on it.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Attach is one mode of a config's stack with its complete attach options.
type Attach struct {
	Mode  string
	Extra map[string]string
}

// Spec is what to build for one config.
type Spec struct {
	Index      int    // the config's position in the run: names its lab
	Config     string // the config's name, for messages
	Style      string // lab style
	Stack      []Attach
	Containers int   // per host
	RxCPUs     []int // the underlay's receive (lab.Spec.RxCPUs); set, the modes leave it alone
	ModeCPUs   []int // the CPUs the modes may steer to (datapath.Options.CPUs); empty = their default
	ToR        bool  // a top-of-rack switch per host
	NAPIThread bool  // the underlay's NAPI in a kernel thread on RxCPUs
	// Background picks a second container pair (BGSender, BGReceiver) for background traffic.
	Background bool
	// SameNode measures between two pods of the sender's host (no overlay crossed).
	SameNode bool
	// IPv6 builds a dual-stack lab (flannel style) and measures between the pods' IPv6
	// addresses: the receiver's Addr is its IPv6 one.
	IPv6 bool
	// IPv6Underlay (with IPv6): flannel-v6.1 over the nodes' IPv6 addresses (lab.Spec.IPv6Underlay).
	IPv6Underlay bool
	// ProxyMode, set, builds the lab with kube-proxy style Services in that mode and has the
	// client connect to Service default/one's ClusterIP (Connect), whose backend is the receiver
	// (with IPv6: its IPv6 ClusterIP, translated to the receiver's IPv6 address).
	ProxyMode string
	// K8s is the run's hold on the Kubernetes lab (style k8s): the config's testbed is a view
	// of the shared cluster, its modes attached by Activate.
	K8s *K8s
}

// Testbed is the lab of one config, with its modes attached: the measured pair, and what the
// runner records about its receive path.
type Testbed struct {
	Config   string
	Lab      *lab.Lab // nil for given namespaces
	Attached []string // host namespaces with the modes attached
	// Sender and Receiver are the measured endpoints; SenderHost is the namespace of the
	// sender's host (an injector sends on its underlay).
	Sender, Receiver lab.Node
	SenderHost       string
	// Connect is the ClusterIP:port the client connects to (Spec.ProxyMode); "" for the
	// receiver's own address.
	Connect    string
	ServerPort int // with Connect: the port the receiver listens on (the Service's target port)
	// NginxPort, set, is where the nginx scenario's server listens instead of nginx's default
	// 8080 (taken in the k8s lab's pods by their own httpd).
	NginxPort int
	// BGSender, BGReceiver carry the background traffic (Spec.Background).
	BGSender, BGReceiver lab.Node
	Stages               map[string]string // "netns/device" -> stage, receiving host's namespaces only
	Offloads             map[string]map[string]bool
	Knobs                map[string]string // "netns:path" -> value the modes set
	given                bool
	real                 *realflannel.Lab // the real-flannel style's lab (Lab is nil)
	k8s                  *K8s             // the k8s style's shared cluster (Lab is nil)
	calico               string           // the calico style's layout name (Lab is nil)
	stack                []Attach         // k8s: the modes Activate attaches
}

// labName gives each config of this process its own lab: "b<pid>x<i>" fits the 12-char limit.
func labName(i int) string { return fmt.Sprintf("b%dx%d", os.Getpid()%100000, i) }

// Up builds the lab of s and attaches its modes on every host, in order. On failure nothing
// is left behind.
func Up(ctx context.Context, s Spec, log func(string, ...any)) (*Testbed, error) {
	if IsRealFlannel(s.Style) {
		return upRealFlannel(ctx, s, log)
	}
	if s.Style == StyleCalico {
		return upCalico(ctx, s, log)
	}
	if IsK8s(s.Style) {
		if s.K8s == nil {
			return nil, fmt.Errorf("%s: the k8s style needs the run's hold on the cluster (OpenK8s)", s.Config)
		}
		return s.K8s.Bed(ctx, s), nil
	}
	spec := lab.Spec{Name: labName(s.Index), Style: s.Style, Hosts: 2, Containers: s.Containers, RxCPUs: s.RxCPUs, ToR: s.ToR, NAPIThread: s.NAPIThread,
		Services: s.ProxyMode != "", ProxyMode: s.ProxyMode, IPv6: s.IPv6, IPv6Underlay: s.IPv6Underlay}
	if s.IPv6 && s.Style != lab.StyleFlannel {
		return nil, fmt.Errorf("%s: --ipv6 needs the flannel style (dual-stack pods), not %s", s.Config, s.Style)
	}
	log("building lab %s for %s", spec.Name, s.Config)
	l, err := lab.Up(ctx, spec, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Config, err)
	}
	tb := &Testbed{Config: s.Config, Lab: l, Knobs: map[string]string{}}
	hosts := make([]string, len(l.Hosts))
	for i, h := range l.Hosts {
		hosts[i] = h.Netns
	}
	// Lab: a mode that programs the lab's own devices (its switches) is told which lab.
	if err := tb.attachStack(ctx, s, hosts, l.Spec.Name); err != nil {
		tb.Teardown()
		return nil, err
	}
	eps := l.Endpoints()
	tb.Sender, tb.Receiver = eps[0], eps[len(eps)-1]
	if err := tb.pickPair(s); err != nil {
		tb.Teardown()
		return nil, err
	}
	if s.IPv6 { // the tools take the receiver's Addr: make it the IPv6 one
		tb.Receiver.Addr = tb.Receiver.Addr6
		tb.Sender.Addr = tb.Sender.Addr6
	}
	tb.SenderHost = tb.Sender.Netns
	recvHost := tb.Receiver.Name
	if tb.Sender.Host != "" {
		h, _ := l.Node(tb.Sender.Host)
		tb.SenderHost = h.Netns
		recvHost = tb.Receiver.Host
	}
	if s.Background {
		if err := tb.pickBackground(); err != nil {
			tb.Teardown()
			return nil, err
		}
	}
	tb.Stages = map[string]string{}
	// With --tor the receiving rack's switch is a stage too ("tor"): its softirq time is the
	// switch's work, which real silicon would do (receive cost minus it is the host's).
	for _, n := range receiveNodes(l, recvHost) {
		for _, d := range n.Devices {
			if d.Stage != "" {
				tb.Stages[n.Netns+"/"+d.Name] = d.Stage
			}
		}
	}
	tb.Offloads = readOffloads(ctx, receiveNodes(l, recvHost))
	return tb, nil
}

// receiveNodes are the nodes of the receiving host: its own namespace, its overlay namespace
// (docker), its containers and, with --tor, its rack's switch. The stage chart and the offloads
// are about the receive path of the measured flow.
func receiveNodes(l *lab.Lab, recvHost string) []lab.Node {
	var out []lab.Node
	for _, set := range [][]lab.Node{l.Hosts, l.Overlays, l.Containers, l.ToRs} {
		for _, n := range set {
			if n.Name == recvHost || n.Host == recvHost {
				out = append(out, n)
			}
		}
	}
	return out
}

// Existing wraps namespaces that exist already (any two on this machine) as a testbed: nothing
// is built, attached or torn down.
func Existing(config, clientNS, serverNS, serverAddr string) *Testbed {
	return &Testbed{
		Config:   config,
		given:    true,
		Stages:   map[string]string{},
		Knobs:    map[string]string{},
		Sender:   lab.Node{Name: clientNS, Netns: clientNS},
		Receiver: lab.Node{Name: serverNS, Netns: serverNS, Addr: serverAddr},
	}
}

// CheckExisting says which of the named namespaces does not exist ("" names none).
func CheckExisting(nss ...string) error {
	for _, ns := range nss {
		if ns != "" && !netnsutil.Exists(ns) {
			return fmt.Errorf("network namespace %q does not exist (see `ip netns list`)", ns)
		}
	}
	return nil
}

// Teardown detaches the modes and removes the lab; given namespaces are not ours to remove.
func (tb *Testbed) Teardown() error {
	if tb.given {
		return nil
	}
	if tb.k8s != nil {
		return tb.k8s.release()
	}
	var errs []error
	for _, ns := range tb.Attached {
		if _, err := datapath.Detach(context.Background(), ns, ""); err != nil {
			errs = append(errs, err)
		}
	}
	if tb.calico != "" {
		if err := downCalico(tb.calico); err != nil {
			errs = append(errs, err)
		}
	} else if tb.real != nil {
		if err := realflannel.Down(tb.real.Spec.Name); err != nil {
			errs = append(errs, err)
		}
	} else if err := lab.Down(tb.Lab.Spec.Name, nil, datapath.ForgetNamespaces); err != nil && !errors.Is(err, lab.ErrNotUp) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Namespaces are every namespace of the testbed's lab (the measured pair's for given ones).
func (tb *Testbed) Namespaces() []string {
	if tb.given {
		return []string{tb.Sender.Netns, tb.Receiver.Netns}
	}
	if tb.real != nil {
		nss, _ := netnsutil.List(realflannel.Prefix(tb.real.Spec.Name))
		return nss
	}
	if tb.calico != "" {
		nss, _ := netnsutil.List(calicoPrefix(tb.calico))
		return nss
	}
	if tb.k8s != nil {
		return append(slices.Clone(tb.k8s.nodes), tb.k8s.named...)
	}
	nss, _ := netnsutil.List(lab.NsPrefix(tb.Lab.Spec.Name))
	return nss
}

// ReceiveHostNetns is the namespace of the receiving host, whose underlay eth0 takes the
// emulated NIC's receive; "" for given namespaces (no lab of ours to attach to).
func (tb *Testbed) ReceiveHostNetns() string {
	if tb.real != nil {
		return tb.real.Nodes[1].Netns // its underlay is eth0 too
	}
	if tb.calico != "" {
		return calicoNode(tb.calico, 2)
	}
	if tb.k8s != nil {
		return tb.k8s.recvNode // node namespace = node name
	}
	if tb.given || tb.Lab == nil {
		return ""
	}
	r := tb.Receiver
	if r.Host == "" {
		return r.Netns
	}
	h, err := tb.Lab.Node(r.Host)
	if err != nil {
		return ""
	}
	return h.Netns
}

// pickBackground picks the background pair: the hosts' other containers, crossing hosts like
// the measured pair.
func (tb *Testbed) pickBackground() error {
	l := tb.Lab
	if l.Spec.Style == lab.StyleNative {
		// No containers: the background shares the hosts with the measured flow, on its own port.
		tb.BGSender, tb.BGReceiver = tb.Sender, tb.Receiver
		return nil
	}
	snd, err := l.Node("h1-c2")
	if err != nil {
		return fmt.Errorf("background needs a second container per host: %w", err)
	}
	rcv, err := l.Node("h2-c1")
	if err != nil {
		return err
	}
	if tb.Sender.Name == snd.Name || tb.Receiver.Name == rcv.Name {
		rcv, _ = l.Node("h2-c2")
		if tb.Receiver.Name == rcv.Name {
			rcv, _ = l.Node("h2-c1")
		}
	}
	tb.BGSender, tb.BGReceiver = *snd, *rcv
	return nil
}

// attachStack attaches s's stack of modes, bottom first, on each of the hosts, and records every
// host it attached on and every knob it set, for Teardown and the run's config record.
func (tb *Testbed) attachStack(ctx context.Context, s Spec, hosts []string, labName string) error {
	for _, a := range s.Stack {
		for _, ns := range hosts {
			opts := datapath.Options{KeepUnderlay: len(s.RxCPUs) > 0, CPUs: s.ModeCPUs, Lab: labName, Extra: maps.Clone(a.Extra)}
			st, err := datapath.Attach(ctx, ns, a.Mode, opts)
			if err != nil {
				return fmt.Errorf("%s: attach %s: %w", s.Config, a.Mode, err)
			}
			if !slices.Contains(tb.Attached, ns) {
				tb.Attached = append(tb.Attached, ns)
			}
			for _, k := range st.Knobs {
				tb.Knobs[k.Netns+":"+k.Path] = k.New
			}
		}
	}
	return nil
}

// pickPair applies Spec.SameNode (the receiver is the sender host's last pod) and
// Spec.ProxyMode (the receiver is Service default/one's backend, reached via its ClusterIP).
func (tb *Testbed) pickPair(s Spec) error {
	eps := tb.Lab.Endpoints()
	mate := func(of lab.Node) (lab.Node, error) {
		var mates []lab.Node
		for _, e := range eps {
			if e.Host != "" && e.Host == of.Host && e.Name != of.Name {
				mates = append(mates, e)
			}
		}
		if len(mates) == 0 {
			return lab.Node{}, fmt.Errorf("%s: same node: style %s has no second pod on %s's host", s.Config, s.Style, of.Name)
		}
		return mates[len(mates)-1], nil
	}
	if s.SameNode && s.ProxyMode == "" {
		r, err := mate(tb.Sender)
		if err != nil {
			return err
		}
		tb.Receiver = r
	}
	if s.ProxyMode != "" {
		svcs := tb.Lab.Services
		if len(svcs) == 0 || len(svcs[0].Backends) != 1 {
			return fmt.Errorf("%s: the lab has no one-backend Service to connect through", s.Config)
		}
		be, err := tb.Lab.Node(svcs[0].Backends[0].Node)
		if err != nil {
			return err
		}
		switch {
		case s.SameNode: // the sender moves to the backend's node (its other pod)
			snd, err := mate(*be)
			if err != nil {
				return err
			}
			tb.Sender = snd
		case be.Host == tb.Sender.Host:
			return fmt.Errorf("%s: Service %s's backend %s is on the sender's host", s.Config, svcs[0].Name, be.Name)
		}
		tb.Receiver, tb.Connect, tb.ServerPort = *be, svcs[0].Target(), svcs[0].Backends[0].Port
		if s.IPv6 { // dual-stack: through the IPv6 ClusterIP to the receiver's IPv6 address
			if tb.Connect = svcs[0].Target6(); tb.Connect == "" {
				return fmt.Errorf("%s: Service %s has no IPv6 ClusterIP (the lab is not dual-stack)", s.Config, svcs[0].Name)
			}
		}
		if tb.ServerPort != ServiceTargetPort(s.Style) {
			return fmt.Errorf("%s: Service %s targets port %d, not %d", s.Config, svcs[0].Name, tb.ServerPort, ServiceTargetPort(s.Style))
		}
	}
	return nil
}

// ServiceTargetPort is the port the measured server listens on when a run connects through a
// Service (its target port) on a bed of style: what modes that single out the workload's port
// (prism's high-priority rule) must name, known before the bed is up.
func ServiceTargetPort(style string) int {
	if IsK8s(style) {
		return k8sServiceTarget
	}
	return lab.VerifyPort
}
