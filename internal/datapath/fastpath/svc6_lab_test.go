package fastpath

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestServiceNATFastPathIPv6 (issue 29 item 3, IPv6 Service NAT): on a dual-stack lab with
// Services (lab up --ipv6 --services; kube-proxy's IPv6 rules, KUBE-FORWARD's INVALID drop
// included), a TCP stream from h1-c1 to default/one's IPv6 ClusterIP (its backend h2-c1, on
// the other node), with the fast path attached to both hosts, in each proxy mode: the backend
// greets, the echo is byte-exact past the first re-learn (5 s), and after learning at least
// 99 % of each direction's packets take the fast path on both nodes: on the backend's node the
// flow is plain pod-to-pod; on the client's node, where conntrack translates the ClusterIP, the
// fast path replays the translation (bpf/fastpath_nat6.h: the 128-bit backend in
// prg_fastpath_nat6 beside the flow). None is dropped on either node. Then 10 short
// connections (the backend's FIN ends each) need no retransmission. Detach leaves no program,
// record, pin or map (the side table included), and the Service still answers over IPv6.
// ipv6ServiceNAT says whether the fast path reproduces a Service's DNAT for IPv6 flows: with
// it false the client's node is held only to no drop and a byte-exact stream.
const ipv6ServiceNAT = true

func TestServiceNATFastPathIPv6(t *testing.T) {
	for _, mode := range []string{lab.ProxyIPTables, lab.ProxyNFTables} {
		t.Run(mode, func(t *testing.T) {
			l := labForTest(t, lab.Spec{Name: "fpsv6" + mode[:2], Style: lab.StyleFlannel, Containers: 2,
				Services: true, ProxyMode: mode, IPv6: true})
			hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
			for _, ep := range l.Endpoints() { // named echo on every pod's IPv6 address, no deadline
				ln, err := netnsutil.Listen(ep.Netns, "tcp6", net.JoinHostPort(ep.Addr6Only(), strconv.Itoa(lab.VerifyPort)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				go lab.ServeTCPEchoFor(ln, ep.Name, 0)
			}
			svc := l.Services[0] // default/one: its one backend is h2-c1
			if svc.ClusterIP6 == "" || svc.Backends[0].Node != "h2-c1" {
				t.Fatalf("default/one: %+v", svc)
			}
			client, err := l.Node("h1-c1")
			if err != nil {
				t.Fatal(err)
			}
			attachAll(t, hosts)

			c, err := netnsutil.DialContext(context.Background(), client.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", svc.Target6())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a stalled flow fails the test, not hangs it
			r, name, err := labtest.ReadGreeting(c)
			if err != nil || name != svc.Backends[0].Node {
				t.Fatalf("%s answered by %q (%v), want %s", svc.Target6(), name, err, svc.Backends[0].Node)
			}
			type snapshot struct{ eg, in [2]Direction }
			snap := make(chan snapshot, 1)
			go func() {
				time.Sleep(time.Second) // learned by then: the handshake and the first segments
				var s snapshot
				for i, h := range hosts {
					s.eg[i], s.in[i] = counters(t, h)
				}
				snap <- s
			}()
			n, err := streamEcho(c, r, 7*time.Second, 29) // past the first re-learn (5 s)
			c.Close()
			if err != nil {
				t.Fatalf("stream via %s to %s: %v (%d bytes echoed)", svc.Target6(), name, err, n)
			}
			before := <-snap
			for i, h := range hosts {
				eg, in := counters(t, h)
				sOut, allOut := fastShare(before.eg[i], eg)
				sIn, allIn := fastShare(before.in[i], in)
				t.Logf("%s %s: %d bytes echoed byte-exact via %s; after learning egress %.2f%% of %d, ingress %.2f%% of %d packets fast (egress %v, ingress %v)",
					mode, h, n, svc.Target6(), 100*sOut, allOut, 100*sIn, allIn, eg, in)
				if eg["dropped"]+in["dropped"] > 0 {
					t.Errorf("%s: fast path dropped packets: egress %v ingress %v", h, eg, in)
				}
				if i == 0 && !ipv6ServiceNAT {
					continue // the client's node: normal path (no IPv6 Service NAT in the fast path)
				}
				if sOut < 0.99 || sIn < 0.99 || allOut == 0 || allIn == 0 {
					t.Errorf("%s: established IPv6 Service stream on the fast path: egress %.2f%% of %d, ingress %.2f%% of %d (want >= 99%%)",
						h, 100*sOut, allOut, 100*sIn, allIn)
				}
			}

			// Short connections (issue 29 item 1, as crr): each answered by the backend and
			// echoed, the client half-closes, the backend's FIN ends it. The backend's node
			// must have retransmitted nothing: a FIN the fast path loses comes back only by
			// retransmission, with backoff (0.2, 0.4, 0.8 s ...: crr at ~1 connection/s).
			be, err := l.Node(svc.Backends[0].Node)
			if err != nil {
				t.Fatal(err)
			}
			retrans0 := tcpRetransSegs(t, be.Netns)
			for i := 0; i < 10; i++ {
				c, err := netnsutil.DialContext(context.Background(), client.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", svc.Target6())
				if err != nil {
					t.Fatalf("short connection %d: %v", i, err)
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				r, name, err := labtest.ReadGreeting(c)
				token := []byte("prg short connection " + strconv.Itoa(i))
				if err == nil {
					_, err = c.Write(token)
				}
				if err == nil {
					err = c.(*net.TCPConn).CloseWrite()
				}
				var got []byte
				if err == nil {
					got, err = io.ReadAll(r) // to the backend's FIN
				}
				c.Close()
				if err != nil || name != svc.Backends[0].Node || string(got) != string(token) {
					t.Fatalf("short connection %d via %s: answered by %q, echo %q, %v", i, svc.Target6(), name, got, err)
				}
			}
			if n := tcpRetransSegs(t, be.Netns) - retrans0; n > 0 {
				t.Errorf("10 short connections via %s: the backend retransmitted %d segments (want 0: a lost FIN or segment)", svc.Target6(), n)
			}

			ids := pinnedMapIDs(t, hosts[0])
			detachLeavesNothing(t, hosts...)
			labtest.MapsGone(t, ids)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if got, err := lab.ServiceEcho(ctx, client.Netns, svc.Target6()); err != nil || got != svc.Backends[0].Node {
				t.Fatalf("after detach, %s: answered by %q, %v", svc.Target6(), got, err)
			}
		})
	}
}

// tcpRetransSegs is the TCP segments namespace ns has retransmitted (/proc/net/snmp's
// Tcp RetransSegs, read by a process inside ns: /proc/net is the reader's namespace).
func tcpRetransSegs(t *testing.T, ns string) uint64 {
	t.Helper()
	out, err := netnsutil.Run(context.Background(), ns, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RetransSegs" && i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
	}
	t.Fatalf("no Tcp RetransSegs in %s's /proc/net/snmp:\n%s", ns, out)
	return 0
}
