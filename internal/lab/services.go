package lab

// Services (--services): Kubernetes Services written into every host namespace the way
// kube-proxy writes them, so the datapath modes meet Service NAT as on a real node.
//
// Two Services, TCP, port ServicePort, both targeting VerifyPort on their backend pods (where
// Verify's echo listeners are, so the greeting names the backend a connection landed on):
//
//	default/one    ServiceAddr(1)  one backend:    the first container of the last host;
//	                               also NodePort ServiceNodePort on every node's addresses
//	default/three  ServiceAddr(3)  three backends: spread over the hosts (see serviceBackends)
//
// ClusterIPs come from ServiceCIDR (198.18.255.0/24: RFC 2544, outside the underlay's /24 and
// the overlay, as a cluster's service CIDR is apart from its pod CIDR). The pods reach them via
// their default route to cni0, so the host's nat PREROUTING (kube-proxy's KUBE-SERVICES, or
// its nftables table's nat-prerouting) translates them; bridged same-node replies pass netfilter
// through br_netfilter, which this kernel has built in (bridge-nf-call-iptables is 1 in every
// namespace), as kube-proxy requires.
//
// Only the flannel style has Services: its pods' traffic is routed in the host namespace,
// where kube-proxy's rules live. The docker style's containers never cross the host's
// netfilter (their bridge is in the overlay namespace), and native/linux have no pods.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Proxy modes: the two ways kube-proxy writes Service rules.
const (
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
)

// ServiceCIDR holds the lab's ClusterIPs.
const ServiceCIDR = "198.18.255.0/24"

// ServicePort is the port every lab Service listens on (its target port is VerifyPort).
const ServicePort = 80

// ServiceNodePort is default/one's NodePort (kube-proxy's range is 30000-32767): any local
// address of a node, port ServiceNodePort, reaches the Service; kube-proxy masquerades such
// traffic (externalTrafficPolicy Cluster), so replies come back through the node.
const ServiceNodePort = 30080

// masqMark is kube-proxy's default masquerade mark bit (--iptables-masquerade-bit 14).
const masqMark = "0x4000"

// Service is one Service of the lab, as `lab status` lists it.
type Service struct {
	Name      string `json:"name"` // namespace/name, as kubectl prints it
	ClusterIP string `json:"cluster_ip"`
	// ClusterIP6 is the Service's IPv6 ClusterIP in a dual-stack lab (--ipv6): the Service is
	// "PreferDualStack", IPv4 first (spec.clusterIPs [ClusterIP, ClusterIP6]).
	ClusterIP6 string    `json:"cluster_ip6,omitempty"`
	Port       int       `json:"port"`
	Protocol   string    `json:"protocol"`
	NodePort   int       `json:"node_port,omitempty"`
	Backends   []Backend `json:"backends"`
}

// Backend is one endpoint of a Service: a lab container and its target port.
type Backend struct {
	Node  string `json:"node"`
	Addr  string `json:"addr"`
	Addr6 string `json:"addr6,omitempty"` // dual-stack lab: the pod's IPv6 address
	Port  int    `json:"port"`
}

// Target is the backend's ip:port ([ip]:port for IPv6), as a DNAT rule writes it and as
// kube-proxy hashes an endpoint into its chain names.
func (b Backend) Target() string { return net.JoinHostPort(b.Addr, strconv.Itoa(b.Port)) }

// Target is the ClusterIP:port clients connect to.
func (s Service) Target() string { return net.JoinHostPort(s.ClusterIP, strconv.Itoa(s.Port)) }

// Target6 is [ClusterIP6]:port, "" when the Service has no IPv6 ClusterIP.
func (s Service) Target6() string {
	if s.ClusterIP6 == "" {
		return ""
	}
	return net.JoinHostPort(s.ClusterIP6, strconv.Itoa(s.Port))
}

// ServiceAddr is the n-th address of ServiceCIDR (the lab uses .1 and .3).
func ServiceAddr(n int) netip.Addr { return nth(netip.MustParsePrefix(ServiceCIDR), n) }

// LabServices lists the lab's Services (none unless the spec asks for them).
func (s *Spec) LabServices() []Service {
	if !s.Services {
		return nil
	}
	backends := s.serviceBackends()
	mk := func(name string, n int, bs []Backend) Service {
		sv := Service{Name: "default/" + name, ClusterIP: ServiceAddr(n).String(), Port: ServicePort, Protocol: "tcp", Backends: bs}
		if s.IPv6 {
			sv.ClusterIP6 = ServiceAddr6(n).String()
		}
		return sv
	}
	one := mk("one", 1, backends[:1])
	one.NodePort = ServiceNodePort
	return []Service{one, mk("three", 3, backends[1:4])}
}

// serviceBackends picks the pods: [0] is "one"'s backend (h<last>-c1), [1:4] are "three"'s,
// taken from the highest container number down, host by host, so with two hosts both carry
// backends and one of them also has a client (its c1) that is, or sits beside, a backend.
func (s *Spec) serviceBackends() []Backend {
	be := func(i, j int) Backend {
		b := Backend{Node: containerName(i, j), Addr: s.ContainerAddr(i, j).Addr().String(), Port: VerifyPort}
		if s.IPv6 {
			b.Addr6 = s.ContainerAddr6(i, j).Addr().String()
		}
		return b
	}
	out := []Backend{be(s.Hosts, 1)}
	for j := s.Containers; j >= 1 && len(out) < 4; j-- {
		for i := 1; i <= s.Hosts && len(out) < 4; i++ {
			out = append(out, be(i, j))
		}
	}
	return out
}

func (s *Spec) validateServices() error {
	if !s.Services {
		if s.ProxyMode != "" {
			return fmt.Errorf("proxy_mode %q needs services (--services)", s.ProxyMode)
		}
		return nil
	}
	switch s.ProxyMode {
	case ProxyIPTables, ProxyNFTables:
	default:
		return fmt.Errorf("unknown proxy mode %q: choose iptables or nftables (kube-proxy's modes)", s.ProxyMode)
	}
	if s.Style != StyleFlannel {
		return fmt.Errorf("--services needs the flannel style (got %s): kube-proxy's rules act in the node's namespace, which only the flannel style's pods are routed through", s.Style)
	}
	if s.Hosts*s.Containers < 3 {
		return fmt.Errorf("--services needs at least 3 containers in all (got %d hosts x %d): Service default/three has 3 backends", s.Hosts, s.Containers)
	}
	sc := netip.MustParsePrefix(ServiceCIDR)
	for _, c := range []string{s.UnderlayCIDR, s.OverlayCIDR} {
		if p, err := netip.ParsePrefix(c); err == nil && p.Overlaps(sc) {
			return fmt.Errorf("%s overlaps the service CIDR %s: pick another", c, ServiceCIDR)
		}
	}
	if s.IPv6 {
		sc6 := netip.MustParsePrefix(ServiceCIDR6)
		for _, c := range []string{s.OverlayCIDR6, DefaultUnderlayCIDR6} {
			if p, err := netip.ParsePrefix(c); err == nil && p.Overlaps(sc6) {
				return fmt.Errorf("%s overlaps the IPv6 service CIDR %s: pick another", c, ServiceCIDR6)
			}
		}
	}
	return nil
}

// kubeHash is the 16-character name suffix kube-proxy derives for its chains: base32 of the
// SHA-256 of the parts (the service port name, protocol and, for endpoints, the endpoint).
func kubeHash(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// portName is the service port name kube-proxy hashes and prints: "default/three:http".
func (s Service) portName() string { return s.Name + ":http" }

// writeServices installs the Services in host i's namespace (and turns on hairpin mode on
// the cni0 ports, as flannel's CNI configuration does, so a pod can reach itself through its
// Service).
func (b *builder) writeServices(i int) error {
	s := b.s
	host, err := b.at(hostName(i))
	if err != nil {
		return err
	}
	for j := 1; j <= s.Containers; j++ {
		lk, err := host.link(BridgePort(j))
		if err != nil {
			return err
		}
		if err := host.h.LinkSetHairpin(lk, true); err != nil {
			return host.errf(BridgePort(j), "set hairpin on", err)
		}
	}
	svcs := s.LabServices()
	ns := s.ns(hostName(i))
	switch s.ProxyMode {
	case ProxyNFTables:
		if err := restore(b.ctx, ns, nftRuleset(svcs, s.OverlayCIDR), "nft", "-f", "-"); err != nil {
			return err
		}
	default:
		if err := restore(b.ctx, ns, iptablesRuleset(svcs, s.OverlayCIDR), "iptables-restore", "-w", "5", "--noflush"); err != nil {
			return err
		}
	}
	if !s.IPv6 {
		return nil
	}
	// Dual-stack: kube-proxy runs a second proxier for IPv6, with its own rules (see services6.go).
	v6 := s.services6()
	if s.ProxyMode == ProxyNFTables {
		return restore(b.ctx, ns, nftRuleset(v6, s.OverlayCIDR6), "nft", "-f", "-")
	}
	return restore(b.ctx, ns, iptablesRuleset(v6, s.OverlayCIDR6), "ip6tables-restore", "-w", "5", "--noflush")
}

// restore feeds a ruleset to a restore tool inside the namespace.
func restore(ctx context.Context, ns, rules string, argv ...string) error {
	if _, err := exec.LookPath(argv[0]); err != nil {
		return fmt.Errorf("%s not found: run scripts/setup.sh (or apt-get install iptables nftables)", argv[0])
	}
	cmd := netnsutil.Command(ctx, ns, argv...)
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %s: %w: %s", ns, argv[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hostCIDR is addr as a host prefix: a.b.c.d/32 or x::y/128.
func hostCIDR(addr string) string {
	if strings.Contains(addr, ":") {
		return addr + "/128"
	}
	return addr + "/32"
}

// iptablesRuleset is what kube-proxy's iptables mode writes for the Services (nat and filter
// tables; firewalls and health checks left out: the lab has none). It serves either family:
// the addresses in svcs decide (services6 gives the IPv6 view, for ip6tables-restore), as
// kube-proxy's IPv6 proxier writes the same chains, with IPv6 addresses, into ip6tables.
func iptablesRuleset(svcs []Service, clusterCIDR string) string {
	var w strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&w, f+"\n", a...) }
	p("*nat")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-NODEPORTS"} {
		p(":%s - [0:0]", c)
	}
	for _, sv := range svcs {
		p(":%s - [0:0]", svcChain(sv))
		if sv.NodePort != 0 {
			p(":%s - [0:0]", extChain(sv))
		}
		for _, be := range sv.Backends {
			p(":%s - [0:0]", sepChain(sv, be))
		}
	}
	p(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	p(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	p(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	p(`-A KUBE-POSTROUTING -m mark ! --mark %s/%s -j RETURN`, masqMark, masqMark)
	p(`-A KUBE-POSTROUTING -j MARK --xor-mark %s`, masqMark)
	p(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	p(`-A KUBE-MARK-MASQ -j MARK --or-mark %s`, masqMark)
	for _, sv := range svcs {
		comment := fmt.Sprintf(`-m comment --comment "%s cluster IP"`, sv.portName())
		match := fmt.Sprintf("-m %s -p %s -d %s --dport %d", sv.Protocol, sv.Protocol, hostCIDR(sv.ClusterIP), sv.Port)
		p(`-A KUBE-SERVICES %s %s -j %s`, comment, match, svcChain(sv))
		// Traffic from outside the pod network is masqueraded, so replies come back here.
		p(`-A %s %s %s ! -s %s -j KUBE-MARK-MASQ`, svcChain(sv), comment, match, clusterCIDR)
		for k, be := range sv.Backends {
			// Backend k of n is taken with probability 1/(n-k) among those left: uniform overall.
			stat := ""
			if left := len(sv.Backends) - k; left > 1 {
				stat = fmt.Sprintf(" -m statistic --mode random --probability %.10f", 1/float64(left))
			}
			p(`-A %s -m comment --comment "%s -> %s"%s -j %s`, svcChain(sv), sv.portName(), be.Target(), stat, sepChain(sv, be))
		}
		if sv.NodePort != 0 {
			c := fmt.Sprintf(`-m comment --comment "%s"`, sv.portName())
			p(`-A KUBE-NODEPORTS %s -m %s -p %s --dport %d -j %s`, c, sv.Protocol, sv.Protocol, sv.NodePort, extChain(sv))
			p(`-A %s -m comment --comment "masquerade traffic for %s external destinations" -j KUBE-MARK-MASQ`, extChain(sv), sv.portName())
			p(`-A %s -j %s`, extChain(sv), svcChain(sv))
		}
		for _, be := range sv.Backends {
			c := fmt.Sprintf(`-m comment --comment "%s"`, sv.portName())
			// Hairpin: a pod reaching itself is masqueraded, or it would answer itself directly.
			p(`-A %s %s -s %s -j KUBE-MARK-MASQ`, sepChain(sv, be), c, hostCIDR(be.Addr))
			p(`-A %s %s -m %s -p %s -j DNAT --to-destination %s`, sepChain(sv, be), c, sv.Protocol, sv.Protocol, be.Target())
		}
	}
	p(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`)
	p("COMMIT")
	p("*filter")
	p(":KUBE-FORWARD - [0:0]")
	p(`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
	p(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP`)
	p(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, masqMark, masqMark)
	p(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	p("COMMIT")
	return w.String()
}

func svcChain(sv Service) string { return "KUBE-SVC-" + kubeHash(sv.portName(), sv.Protocol) }
func extChain(sv Service) string { return "KUBE-EXT-" + kubeHash(sv.portName(), sv.Protocol) }
func sepChain(sv Service, be Backend) string {
	return "KUBE-SEP-" + kubeHash(sv.portName(), sv.Protocol, be.Target())
}

// NFTTable is the table kube-proxy's nftables mode owns.
const NFTTable = "kube-proxy"

// nftRuleset is what kube-proxy's nftables mode writes for the Services: one "ip kube-proxy"
// table (IPv4; "ip6 kube-proxy" when svcs hold IPv6 addresses, as kube-proxy's IPv6 proxier
// writes its own table) whose services chain looks the destination up in the service-ips
// verdict map, a chain per service port choosing a backend with numgen, a chain per endpoint
// doing the DNAT.
func nftRuleset(svcs []Service, clusterCIDR string) string {
	ipX, addrType, noLocalhost := "ip", "ipv4_addr", "ip daddr != 127.0.0.0/8"
	if len(svcs) > 0 && strings.Contains(svcs[0].ClusterIP, ":") {
		ipX, addrType, noLocalhost = "ip6", "ipv6_addr", "ip6 daddr != ::1"
	}
	var w strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&w, f+"\n", a...) }
	p("table %s %s {", ipX, NFTTable)
	p(`  comment "rules for kube-proxy"`)
	p("  chain mark-for-masquerade { mark set mark or %s; }", masqMark)
	p("  chain masquerading {")
	p("    mark and %s == 0 return", masqMark)
	p("    mark set mark xor %s", masqMark)
	p("    masquerade fully-random")
	p("  }")
	p("  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }")
	// dstnat (-100): nft names that priority only on prerouting.
	p("  chain nat-output { type nat hook output priority -100; policy accept; jump services; }")
	p("  chain nat-postrouting { type nat hook postrouting priority srcnat; policy accept; jump masquerading; }")
	// Conntrack-invalid packets are dropped in forward, as kube-proxy does unless the
	// conntrack TCP window checks are relaxed (nf_conntrack_tcp_be_liberal).
	p("  chain filter-forward { type filter hook forward priority -110; policy accept; ct state invalid drop; }")
	p("  set cluster-ips { type %s; comment \"Active ClusterIPs\"; }", addrType)
	p("  map service-ips { type %s . inet_proto . inet_service : verdict; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"; }", addrType)
	p("  map service-nodeports { type inet_proto . inet_service : verdict; comment \"NodePort traffic\"; }")
	// NodePorts last, on the node's own addresses (not loopback), as kube-proxy matches them.
	p("  chain services {")
	p("    %s daddr . meta l4proto . th dport vmap @service-ips", ipX)
	p("    fib daddr type local %s meta l4proto . th dport vmap @service-nodeports", noLocalhost)
	p("  }")
	for _, sv := range svcs {
		var arms []string
		for k, be := range sv.Backends {
			arms = append(arms, fmt.Sprintf("%d : goto %s", k, nftEndpointChain(sv, be)))
		}
		if sv.NodePort != 0 {
			p("  chain %s { jump mark-for-masquerade; goto %s; }", nftExternalChain(sv), nftServiceChain(sv))
		}
		p("  chain %s {", nftServiceChain(sv))
		p("    %s daddr %s %s dport %d %s saddr != %s jump mark-for-masquerade", ipX, sv.ClusterIP, sv.Protocol, sv.Port, ipX, clusterCIDR)
		p("    numgen random mod %d vmap { %s }", len(sv.Backends), strings.Join(arms, ", "))
		p("  }")
		for _, be := range sv.Backends {
			p("  chain %s {", nftEndpointChain(sv, be))
			p("    %s saddr %s jump mark-for-masquerade", ipX, be.Addr)
			p("    meta l4proto %s dnat to %s", sv.Protocol, be.Target())
			p("  }")
		}
	}
	p("}")
	for _, sv := range svcs {
		p("add element %s %s cluster-ips { %s }", ipX, NFTTable, sv.ClusterIP)
		p("add element %s %s service-ips { %s . %s . %d : goto %s }", ipX, NFTTable, sv.ClusterIP, sv.Protocol, sv.Port, nftServiceChain(sv))
		if sv.NodePort != 0 {
			p("add element %s %s service-nodeports { %s . %d : goto %s }", ipX, NFTTable, sv.Protocol, sv.NodePort, nftExternalChain(sv))
		}
	}
	return w.String()
}

// nftChainBase is kube-proxy's chain name base: 8 base32 characters of the SHA-256 of the
// name, "-", the name ("<namespace>/<name>/<protocol>/<port name>", for an endpoint followed
// by "__<ip>/<port>"). The lab's names are far below nftables' length limit: no truncation.
func nftChainBase(name string) string {
	sum := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
}

// nftPortName is "<namespace>/<name>/<protocol>/<port name>".
func nftPortName(sv Service) string { return fmt.Sprintf("%s/%s/http", sv.Name, sv.Protocol) }

// nftServiceChain is "service-<hash>-default/three/tcp/http".
func nftServiceChain(sv Service) string { return "service-" + nftChainBase(nftPortName(sv)) }

// nftExternalChain is the service chain's base with "external-" (NodePort traffic: masqueraded).
func nftExternalChain(sv Service) string { return "external-" + nftChainBase(nftPortName(sv)) }

// nftEndpointChain is "endpoint-<hash>-default/three/tcp/http__<ip>/<port>"; an IPv6 address
// has its colons turned into dots (nftables allows no ":" in a chain name), as kube-proxy does.
func nftEndpointChain(sv Service, be Backend) string {
	ip := strings.ReplaceAll(be.Addr, ":", ".")
	return "endpoint-" + nftChainBase(fmt.Sprintf("%s__%s/%d", nftPortName(sv), ip, be.Port))
}

// serviceProbes is how many connections each client opens to a Service with several backends
// while looking for all of them: with 3 backends chosen uniformly, missing one in 64 tries
// happens with probability 3*(2/3)^64, about 1e-11.
const serviceProbes = 64

// verifyServices proves that a client on every host (its first container) reaches every
// Service: each connection is answered by one of the Service's backends (the greeting names
// it), the echo comes back intact through the reverse translation, and over serviceProbes
// connections every backend answers at least once. Verify's listeners must be up.
func verifyServices(ctx context.Context, l *Lab) (paths int, failures []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 1; i <= l.Spec.Hosts; i++ {
		client := containerName(i, 1)
		cn, err := l.Node(client)
		if err != nil {
			failures = append(failures, err.Error())
			continue
		}
		for _, sv := range l.Services {
			// Dual-stack: each Service over its IPv6 ClusterIP too (Verify's listeners serve
			// the pods' IPv6 addresses on the same port).
			for _, target := range []string{sv.Target(), sv.Target6()} {
				if target == "" {
					continue
				}
				paths++
				wg.Add(1)
				go func(ns string, sv Service, target string) {
					defer wg.Done()
					if err := probeService(ctx, ns, sv, target); err != nil {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("%s -> Service %s (%s): %v", client, sv.Name, target, err))
						mu.Unlock()
					}
				}(cn.Netns, sv, target)
			}
		}
	}
	wg.Wait()
	return paths, failures
}

// probeService connects to the Service at target (its IPv4 or IPv6 ClusterIP:port) from inside
// ns until every backend has answered (at most serviceProbes connections; a one-backend
// Service gets 8).
func probeService(ctx context.Context, ns string, sv Service, target string) error {
	seen := map[string]int{}
	valid := map[string]bool{}
	for _, be := range sv.Backends {
		valid[be.Node] = true
	}
	tries := serviceProbes
	if len(sv.Backends) == 1 {
		tries = 8
	}
	for n := 0; n < tries && len(seen) < len(sv.Backends); n++ {
		name, err := ServiceEcho(ctx, ns, target)
		if err != nil {
			return fmt.Errorf("connection %d: %w", n+1, err)
		}
		if !valid[name] {
			return fmt.Errorf("answered by %q, which is not a backend of the Service", name)
		}
		seen[name]++
	}
	if len(seen) < len(sv.Backends) {
		return fmt.Errorf("only %d of %d backends answered in %d connections (%v)", len(seen), len(sv.Backends), tries, seen)
	}
	return nil
}

// ServiceEcho opens one TCP connection from inside ns to target (a ClusterIP:port of the lab,
// whose backends run Verify's echo servers), checks that the echo comes back intact and
// returns the name of the node that answered.
func ServiceEcho(ctx context.Context, ns, target string) (string, error) {
	var conn net.Conn
	err := netnsutil.Do(ns, func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, "tcp", target) // the literal in target picks the family
		conn = c
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("no greeting: %w", err)
	}
	name := strings.TrimSpace(line)
	token := []byte("peregrine-service " + target)
	if _, err := conn.Write(token); err != nil {
		return name, err
	}
	buf := make([]byte, len(token))
	if _, err := io.ReadFull(r, buf); err != nil {
		return name, fmt.Errorf("no echo from %s: %w", name, err)
	}
	if string(buf) != string(token) {
		return name, fmt.Errorf("echo from %s came back corrupted", name)
	}
	return name, nil
}

// ListenEcho runs Verify's TCP echo server (which greets with the node's name) on VerifyPort
// at the endpoint's address, as a Service backend; the returned func stops it.
func ListenEcho(ep Node) (func(), error) {
	l, err := netnsutil.Listen(ep.Netns, "tcp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), VerifyPort))
	if err != nil {
		return nil, fmt.Errorf("listen in %s: %w", ep.Netns, err)
	}
	go ServeTCPEcho(l, ep.Name)
	return func() { l.Close() }, nil
}
