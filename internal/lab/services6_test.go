package lab

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

func dualStackServicesSpec(name, mode string, underlay bool) Spec {
	s := servicesSpec(name, mode)
	s.IPv6, s.IPv6Underlay = true, underlay
	return s
}

// kube-proxy's own names for its test Service ns1/svc1 port p80 (pkg/proxy/iptables and
// nftables proxier tests): the lab's hashes must be kube-proxy's, IPv6 endpoints included.
func TestKubeProxyChainNames(t *testing.T) {
	sv := Service{Name: "ns1/svc1", Protocol: "tcp"}
	for _, c := range []struct{ got, want string }{
		{"KUBE-SVC-" + kubeHash("ns1/svc1:p80", "tcp"), "KUBE-SVC-XPGD46QRK7WJZT7O"},
		{"KUBE-SEP-" + kubeHash("ns1/svc1:p80", "tcp", Backend{Addr: "10.180.0.1", Port: 80}.Target()), "KUBE-SEP-SXIVWICOYRO3J4NJ"},
		{nftChainBase("ns1/svc1/tcp/p80"), "ULMVA6XW-ns1/svc1/tcp/p80"},
		{nftChainBase("ns1/svc1/tcp/p80__10.180.0.1/80"), "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"},
		{nftChainBase("ns1/svc1/tcp/p80__fd00.10.180..1/80"), "ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80"},
		{nftChainBase("ns1/svc1/tcp/p80__fd00.10.180..2.1/80"), "2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80"},
		// The lab's port name is "http": the endpoint chain of an IPv6 backend, colons as dots.
		{nftEndpointChain(sv, Backend{Addr: "fd00:10:180::2:1", Port: 80}),
			"endpoint-" + nftChainBase("ns1/svc1/tcp/http__fd00.10.180..2.1/80")},
		{Backend{Addr: "fd00:10:180::1", Port: 80}.Target(), "[fd00:10:180::1]:80"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

func TestServices6Validate(t *testing.T) {
	s := dualStackServicesSpec("x", "", false)
	s.Defaults()
	if err := s.Validate(); err != nil {
		t.Fatalf("--ipv6 --services: %v", err)
	}
	s = dualStackServicesSpec("x", "", false)
	s.OverlayCIDR6 = "fd70:7267::/32" // holds the IPv6 service CIDR
	s.Defaults()
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "overlaps the IPv6 service CIDR") {
		t.Fatalf("overlay over the IPv6 service CIDR: %v", err)
	}
	// Without --ipv6 the Services stay single-stack.
	s = servicesSpec("x", "")
	s.Defaults()
	for _, sv := range s.LabServices() {
		if sv.ClusterIP6 != "" || sv.Target6() != "" || sv.Backends[0].Addr6 != "" {
			t.Fatalf("IPv4-only lab has IPv6 Service data: %+v", sv)
		}
	}
}

func TestServices6Addresses(t *testing.T) {
	s := dualStackServicesSpec("x", "", false)
	s.Defaults()
	svcs := s.LabServices()
	if svcs[0].ClusterIP6 != "fd70:7267:2::1" || svcs[1].ClusterIP6 != "fd70:7267:2::3" || svcs[1].Target6() != "[fd70:7267:2::3]:80" {
		t.Fatalf("IPv6 ClusterIPs %s %s", svcs[0].ClusterIP6, svcs[1].ClusterIP6)
	}
	// default/one's backend is h2-c1, whose IPv6 address is ::2 of h2's /64.
	if be := svcs[0].Backends[0]; be.Node != "h2-c1" || be.Addr6 != "fd70:7267:0:2::2" {
		t.Fatalf("one's backend %+v", be)
	}
	v6 := s.services6()
	if v6[0].ClusterIP != "fd70:7267:2::1" || v6[0].Backends[0].Addr != "fd70:7267:0:2::2" || v6[0].NodePort != 0 {
		t.Fatalf("IPv6 view without an IPv6 underlay: %+v", v6[0])
	}
	su := dualStackServicesSpec("x", "", true)
	su.Defaults()
	if v := su.services6(); v[0].NodePort != ServiceNodePort {
		t.Fatalf("IPv6 view with an IPv6 underlay has no NodePort: %+v", v[0])
	}
}

func TestIP6TablesRulesetLayout(t *testing.T) {
	s := dualStackServicesSpec("x", "", false)
	s.Defaults()
	v4, v6 := s.LabServices(), s.services6()
	rules := iptablesRuleset(v6, s.OverlayCIDR6)
	vp := strconv.Itoa(VerifyPort)
	three := v6[1]
	be := three.Backends[0]
	for _, want := range []string{
		"*nat",
		"-A KUBE-SERVICES -m comment --comment \"default/three:http cluster IP\" -m tcp -p tcp -d fd70:7267:2::3/128 --dport 80 -j " + svcChain(three),
		"! -s " + s.OverlayCIDR6 + " -j KUBE-MARK-MASQ",
		"-m comment --comment \"default/three:http -> [" + be.Addr + "]:" + vp + "\" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-" + kubeHash("default/three:http", "tcp", "["+be.Addr+"]:"+vp),
		"-s " + be.Addr + "/128 -j KUBE-MARK-MASQ",
		"-j DNAT --to-destination [" + be.Addr + "]:" + vp,
		"-j MASQUERADE --random-fully",
		"*filter",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("IPv6 ruleset lacks %q:\n%s", want, rules)
		}
	}
	// A Service's chains are named as in IPv4 (the hash has no address); its endpoints' differ.
	if svcChain(v6[1]) != svcChain(v4[1]) || sepChain(v6[1], v6[1].Backends[0]) == sepChain(v4[1], v4[1].Backends[0]) {
		t.Error("IPv6 chain names: want the Service's as IPv4's, the endpoints' apart")
	}
	if strings.Contains(rules, "198.") || strings.Contains(rules, "/32") || strings.Contains(rules, "KUBE-NODEPORTS -m") {
		t.Errorf("IPv6 ruleset (no IPv6 underlay) holds IPv4 addresses or a NodePort:\n%s", rules)
	}
	su := dualStackServicesSpec("x", "", true)
	su.Defaults()
	if r := iptablesRuleset(su.services6(), su.OverlayCIDR6); !strings.Contains(r, "-A KUBE-NODEPORTS -m comment --comment \"default/one:http\" -m tcp -p tcp --dport 30080") {
		t.Errorf("IPv6 underlay: no IPv6 NodePort:\n%s", r)
	}
}

func TestNFT6RulesetLayout(t *testing.T) {
	s := dualStackServicesSpec("x", ProxyNFTables, false)
	s.Defaults()
	v6 := s.services6()
	rules := nftRuleset(v6, s.OverlayCIDR6)
	vp := strconv.Itoa(VerifyPort)
	be := v6[1].Backends[1]
	for _, want := range []string{
		"table ip6 kube-proxy {",
		"set cluster-ips { type ipv6_addr;",
		"map service-ips { type ipv6_addr . inet_proto . inet_service : verdict;",
		"ip6 daddr . meta l4proto . th dport vmap @service-ips",
		"fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports",
		"ip6 daddr fd70:7267:2::3 tcp dport 80 ip6 saddr != " + s.OverlayCIDR6 + " jump mark-for-masquerade",
		"chain " + nftEndpointChain(v6[1], be) + " {",
		"__" + strings.ReplaceAll(be.Addr, ":", ".") + "/" + vp,
		"ip6 saddr " + be.Addr + " jump mark-for-masquerade",
		"meta l4proto tcp dnat to [" + be.Addr + "]:" + vp,
		"add element ip6 kube-proxy service-ips { fd70:7267:2::3 . tcp . 80 : goto " + nftServiceChain(v6[1]) + " }",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("IPv6 nft ruleset lacks %q:\n%s", want, rules)
		}
	}
	if strings.Contains(rules, "ip daddr") || strings.Contains(rules, "service-nodeports {  tcp") || strings.Contains(rules, "add element ip6 kube-proxy service-nodeports") {
		t.Errorf("IPv6 nft ruleset (no IPv6 underlay) has IPv4 matches or a NodePort:\n%s", rules)
	}
	if strings.Contains(nftEndpointChain(v6[1], be), ":") {
		t.Error("a chain name may not hold ':'")
	}
}

// TestServicesDualStack builds a dual-stack lab with Services in each proxy mode (nftables
// over an IPv6 underlay, so with the IPv6 NodePort): lab up's verification has reached every
// Service over both ClusterIPs; here each IPv6 ClusterIP is answered by its backends only
// (greeting), every backend of default/three answers over IPv6, the IPv6 rules are where
// kube-proxy keeps them, with an IPv6 underlay the IPv6 NodePort answers on every node's IPv6
// address, and the root namespace gets no rule (lab down's cleanup checks the rest).
func TestServicesDualStack(t *testing.T) {
	for _, c := range []struct {
		mode     string
		underlay bool
	}{{ProxyIPTables, false}, {ProxyNFTables, true}} {
		t.Run(c.mode, func(t *testing.T) {
			l := upForTest(t, dualStackServicesSpec("tsv6"+c.mode[:2], c.mode, c.underlay))
			if len(l.Services) != 2 || l.Services[1].ClusterIP6 == "" {
				t.Fatalf("status lists %+v", l.Services)
			}
			h1, _ := l.Node("h1")
			dump := []string{"ip6tables-save", "-t", "nat"}
			want := "--comment \"default/three:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-"
			if c.mode == ProxyNFTables {
				dump, want = []string{"nft", "list", "table", "ip6", NFTTable}, "ip6 daddr . meta l4proto . th dport vmap @service-ips"
			}
			out, err := netnsutil.Run(context.Background(), h1.Netns, dump...)
			if err != nil || !strings.Contains(out, want) || !strings.Contains(out, l.Services[1].ClusterIP6) {
				t.Fatalf("%v in %s: %v, want %q and %s:\n%s", dump, h1.Netns, err, want, l.Services[1].ClusterIP6, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var stops []func()
			for _, ep := range l.Endpoints() {
				cs, err := listen6(ep)
				for _, c := range cs {
					stops = append(stops, func() { c.Close() })
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			defer func() {
				for _, s := range stops {
					s()
				}
			}()
			for _, client := range []string{"h1-c1", "h2-c2"} {
				n, err := l.Node(client)
				if err != nil {
					t.Fatal(err)
				}
				for _, sv := range l.Services {
					if err := probeService(ctx, n.Netns, sv, sv.Target6()); err != nil {
						t.Errorf("%s -> %s (%s): %v", client, sv.Name, sv.Target6(), err)
					}
				}
				for i, h := range l.Hosts {
					if !c.underlay {
						break // no IPv6 node address, no IPv6 NodePort (TestIP6TablesRulesetLayout)
					}
					target := net.JoinHostPort(l.Spec.HostAddr6(i+1).Addr().String(), strconv.Itoa(ServiceNodePort))
					if name, err := ServiceEcho(ctx, n.Netns, target); err != nil || name != l.Services[0].Backends[0].Node {
						t.Errorf("%s -> IPv6 NodePort %s on %s: answered by %q, %v", client, target, h.Name, name, err)
					}
				}
			}
			assertRootHasNoServiceRules(t)
			if out, err := exec.Command("ip6tables-save").CombinedOutput(); err != nil || strings.Contains(string(out), "fd70:7267:2:") {
				t.Errorf("the root namespace's ip6tables: %v\n%s", err, out)
			}
		})
	}
}
