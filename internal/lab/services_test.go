package lab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func servicesSpec(name, mode string) Spec {
	return Spec{Name: name, Style: StyleFlannel, Hosts: 2, Containers: 2, Services: true, ProxyMode: mode}
}

func TestServicesValidate(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Style: StyleDocker, Containers: 2, Services: true}, "needs the flannel style"},
		{Spec{Style: StyleFlannel, Containers: 1, Services: true}, "at least 3 containers"},
		{Spec{Style: StyleFlannel, Containers: 2, Services: true, ProxyMode: "ipvs"}, "unknown proxy mode"},
		{Spec{Style: StyleFlannel, Containers: 2, ProxyMode: ProxyNFTables}, "needs services"},
		{Spec{Style: StyleFlannel, Containers: 2, Services: true, UnderlayCIDR: "198.18.0.0/16"}, "overlaps the service CIDR"},
	} {
		s := c.spec
		s.Defaults()
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error with %q", c.spec, err, c.want)
		}
	}
	s := servicesSpec("x", "")
	s.Defaults()
	if err := s.Validate(); err != nil || s.ProxyMode != ProxyIPTables {
		t.Fatalf("default proxy mode: %v, %q", err, s.ProxyMode)
	}
}

func TestServiceBackendsSpanHosts(t *testing.T) {
	s := servicesSpec("x", "")
	s.Defaults()
	svcs := s.LabServices()
	if len(svcs) != 2 || len(svcs[0].Backends) != 1 || len(svcs[1].Backends) != 3 {
		t.Fatalf("services = %+v", svcs)
	}
	hosts := map[string]bool{}
	seen := map[string]bool{}
	for _, be := range svcs[1].Backends {
		hosts[be.Node[:2]] = true
		if seen[be.Node] {
			t.Fatalf("backend %s twice", be.Node)
		}
		seen[be.Node] = true
	}
	if len(hosts) != 2 {
		t.Fatalf("three's backends %+v are not on both hosts", svcs[1].Backends)
	}
	if svcs[0].ClusterIP != "198.18.255.1" || svcs[1].ClusterIP != "198.18.255.3" {
		t.Fatalf("ClusterIPs %s %s", svcs[0].ClusterIP, svcs[1].ClusterIP)
	}
}

// The iptables rules pick backend k of n with probability 1/(n-k): uniform over the backends.
func TestIPTablesRulesetLayout(t *testing.T) {
	s := servicesSpec("x", "")
	s.Defaults()
	svcs := s.LabServices()
	rules := iptablesRuleset(svcs, s.OverlayCIDR)
	three := svcs[1]
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-A " + svcChain(three) + " -m comment --comment \"default/three:http -> " + three.Backends[0].Target() + "\" -m statistic --mode random --probability 0.3333333333 -j " + sepChain(three, three.Backends[0]),
		"--probability 0.5000000000 -j " + sepChain(three, three.Backends[1]),
		"-j DNAT --to-destination " + three.Backends[2].Target(),
		"-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
		"! -s 198.19.0.0/16 -j KUBE-MARK-MASQ",
		"-A KUBE-NODEPORTS -m comment --comment \"default/one:http\" -m tcp -p tcp --dport 30080 -j " + extChain(svcs[0]),
		"-A " + extChain(svcs[0]) + " -m comment --comment \"masquerade traffic for default/one:http external destinations\" -j KUBE-MARK-MASQ",
		"-A " + extChain(svcs[0]) + " -j " + svcChain(svcs[0]),
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rules)
		}
	}
	if strings.Contains(rules, sepChain(three, three.Backends[2])+"\n-A") && strings.Contains(rules, "statistic --mode random --probability 1.0") {
		t.Error("the last backend must be unconditional")
	}
	if len(svcChain(three)) != len("KUBE-SVC-")+16 || svcChain(three) == svcChain(svcs[0]) {
		t.Errorf("chain names %s %s", svcChain(three), svcChain(svcs[0]))
	}
}

func TestNFTRulesetLayout(t *testing.T) {
	s := servicesSpec("x", ProxyNFTables)
	s.Defaults()
	svcs := s.LabServices()
	rules := nftRuleset(svcs, s.OverlayCIDR)
	for _, want := range []string{
		"table ip kube-proxy {",
		"ip daddr . meta l4proto . th dport vmap @service-ips",
		"numgen random mod 3 vmap { 0 : goto endpoint-",
		"198.18.255.3 . tcp . 80 : goto service-",
		"masquerade fully-random",
		"meta l4proto tcp dnat to " + svcs[1].Backends[1].Target(),
		"fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
		"service-nodeports { tcp . 30080 : goto " + nftExternalChain(svcs[0]) + " }",
		"chain " + nftExternalChain(svcs[0]) + " { jump mark-for-masquerade; goto " + nftServiceChain(svcs[0]) + "; }",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rules)
		}
	}
}

// TestServicesBothProxyModes builds a lab with Services in each mode: a ClusterIP connection
// lands on a backend and the echo returns, every backend of default/three answers over many
// connections from each host, and the root namespace gets no rule.
func TestServicesBothProxyModes(t *testing.T) {
	for _, mode := range []string{ProxyIPTables, ProxyNFTables} {
		t.Run(mode, func(t *testing.T) {
			l := upForTest(t, servicesSpec("tsv"+mode[:2], mode))
			if len(l.Services) != 2 {
				t.Fatalf("status lists %d services", len(l.Services))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			stop := serveEchoes(t, l)
			defer stop()
			for i, client := range []string{"h1-c1", "h2-c2"} {
				n, err := l.Node(client)
				if err != nil {
					t.Fatal(err)
				}
				for _, sv := range l.Services {
					hits := map[string]int{}
					for k := 0; k < 60; k++ {
						name, err := ServiceEcho(ctx, n.Netns, sv.Target())
						if err != nil {
							t.Fatalf("%s -> %s: %v", client, sv.Target(), err)
						}
						hits[name]++
					}
					for _, be := range sv.Backends {
						if hits[be.Node] == 0 {
							t.Errorf("client %d %s -> %s: backend %s never answered (%v)", i, client, sv.Name, be.Node, hits)
						}
						delete(hits, be.Node)
					}
					if len(hits) > 0 {
						t.Errorf("%s -> %s answered by non-backends %v", client, sv.Name, hits)
					}
				}
				// default/one's NodePort on every node's address (its own node's included).
				for _, h := range l.Hosts {
					target := fmt.Sprintf("%s:%d", h.AddrOnly(), ServiceNodePort)
					name, err := ServiceEcho(ctx, n.Netns, target)
					if err != nil || name != l.Services[0].Backends[0].Node {
						t.Errorf("%s -> NodePort %s: answered by %q, %v", client, target, name, err)
					}
				}
			}
			assertRootHasNoServiceRules(t)
		})
	}
}

// serveEchoes runs the verification echo server on VerifyPort in every container.
func serveEchoes(t *testing.T, l *Lab) func() {
	t.Helper()
	var stops []func()
	for _, ep := range l.Endpoints() {
		stop, err := ListenEcho(ep)
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, stop)
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

func assertRootHasNoServiceRules(t *testing.T) {
	t.Helper()
	for _, argv := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
		if strings.Contains(string(out), "198.18.255.") {
			t.Errorf("the root namespace holds a lab Service rule (%v):\n%s", argv, out)
		}
	}
}
