package fastpath

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
	"github.com/peregrine-net/peregrine/internal/workload/crr"
)

// TestLabIPv6ClosedLeaveNoConntrack is TestLabClosedLeaveNoConntrack between two dual-stack
// pods' IPv6 addresses (the lab's --ipv6): short IPv6 connections ride the fast path from
// their handshake to their close (FP_F_HSONLY, bpf/fastpath6.h), each close hands the
// connection to the agent in an IPv6 ring record, and the agent deletes its conntrack entry
// by id (ctclosed.go): no entry is left on either node, with INVALID dropped on both as
// kube-proxy's ip6tables rules do, and the client's ports wrapping every 1024 connections.
func TestLabIPv6ClosedLeaveNoConntrack(t *testing.T) {
	for _, tool := range []string{"ip6tables", "conntrack"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s (scripts/setup.sh installs it)", tool)
		}
	}
	l := labForTest(t, lab.Spec{Name: "fpct6", Style: lab.StyleFlannel, Containers: 1, IPv6: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	for _, h := range hosts {
		labtest.FirstRule(t, h, "ip6tables", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	mustRun(t, c1.Netns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 41023") // IPv6 too
	attachAll(t, hosts)

	const n = 3000
	before, _ := Inspect(hosts[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := net.JoinHostPort(c2.Addr6Only(), "9311")
	r, err := crr.Run(ctx, crr.Config{ServerNS: c2.Netns, Listen: addr, ClientNS: c1.Netns, Connect: addr,
		Clients: 2, Response: 512, Count: n, Duration: 50 * time.Second})
	if err != nil || r.Failures != 0 || r.Connections != n {
		t.Fatalf("crr over IPv6: %d connections, %d failures (%s): %v", r.Connections, r.Failures, r.FirstError, err)
	}
	after, _ := Inspect(hosts[0])
	t.Logf("%d IPv6 connections at %.0f/s (p50 %.0f us, p99 %.0f us); client node: %d egress hits, %d ingress hits",
		r.Connections, r.PerSec, r.P50Us, r.P99Us, after.Egress["hit"]-before.Egress["hit"], after.Ingress["hit"]-before.Ingress["hit"])
	if eg := after.Egress["hit"] - before.Egress["hit"]; eg < n {
		t.Fatalf("the IPv6 connections did not take the fast path: %d egress hits for %d connections", eg, n)
	}
	labtest.Eventually(t, 500*time.Millisecond, "the closed IPv6 connections' conntrack entries deleted on both nodes", func() (bool, string) {
		var left []string
		total := 0
		for _, h := range hosts {
			for s, k := range ctStates6(t, h, c1.Addr6Only(), c2.Addr6Only()) {
				total += k
				left = append(left, fmt.Sprintf("%s %s %d", netnsutil.Label(h), s, k))
			}
		}
		return total == 0, "entries left: " + strings.Join(left, ", ")
	})
	drops := 0
	for _, h := range hosts {
		d := invalidDrops6(t, h)
		drops += d
		t.Logf("%s: %d IPv6 packets dropped as INVALID", netnsutil.Label(h), d)
	}
	if drops > n/1000 {
		t.Errorf("%d IPv6 packets dropped as INVALID for %d connections (want at most %d)", drops, n, n/1000)
	}
	if r.P99Us >= 1e6 {
		t.Errorf("p99 of a connection %.0f us: connections waited for SYN retransmissions", r.P99Us)
	}
}

// ctStates6 is ctStates for IPv6 entries.
func ctStates6(t *testing.T, ns, src, dst string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := netnsutil.Run(ctx, ns, "conntrack", "-L", "-f", "ipv6", "-p", "tcp", "--orig-src", src, "--orig-dst", dst)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "tcp" {
			m[f[3]]++
		}
	}
	return m
}

// invalidDrops6 is invalidDrops for ip6tables' FORWARD chain.
func invalidDrops6(t *testing.T, ns string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := netnsutil.Run(ctx, ns, "ip6tables", "-w", "5", "-L", "FORWARD", "-v", "-n", "-x")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "DROP" && strings.Contains(line, "INVALID") {
			var k int
			fmt.Sscan(f[0], &k)
			return k
		}
	}
	t.Fatalf("no INVALID drop rule in %s:\n%s", netnsutil.Label(ns), out)
	return 0
}
