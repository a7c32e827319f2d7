package fastpath

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestSameNodeAndServiceBackends, in both kube-proxy modes, from pod h1-c1 with the fast path
// on both hosts:
//   - to h1-c2's own address (same node): byte-exact, and after learning >= 99 % of the node's
//     packets of the flow are delivered pod to pod ("local" hits);
//   - to Service default/three, whose backends are h1-c2 (same node), h2-c2 (the other node)
//     and h1-c1 itself (hairpin): connections until each backend had one (kube-proxy's
//     random choice spreads them), each stream byte-exact with the backend conntrack chose
//     for it; the same-node backend's packets go pod to pod, the remote one's over the
//     overlay's fast path, and the hairpin (MASQUERADEd by kube-proxy) stays on the normal
//     path, counted "nat", with no hit;
//   - to default/one's NodePort on its own node's address: masqueraded, so "nat", no hit.
func TestSameNodeAndServiceBackends(t *testing.T) {
	for _, mode := range []string{lab.ProxyIPTables, lab.ProxyNFTables} {
		t.Run(mode, func(t *testing.T) {
			spec := lab.Spec{Name: "fpsn" + mode[:2], Style: lab.StyleFlannel, Containers: 2, Services: true, ProxyMode: mode}
			l, hosts := serviceLab(t, spec)
			attachAll(t, hosts)
			defer func() {
				for _, h := range hosts {
					if _, err := datapath.Detach(context.Background(), h, Name); err != nil {
						t.Errorf("detach %s: %v", h, err)
					}
				}
			}()
			client, err := l.Node("h1-c1")
			if err != nil {
				t.Fatal(err)
			}
			peer, err := l.Node("h1-c2")
			if err != nil {
				t.Fatal(err)
			}
			egress := func() Direction {
				v, err := Inspect(hosts[0])
				if err != nil {
					t.Fatal(err)
				}
				return v.Egress
			}

			// Pod to pod on one node.
			c, r, name := labtest.DialNamed(t, client.Netns, fmt.Sprintf("%s:%d", peer.AddrOnly(), lab.VerifyPort), 20*time.Second)
			if name != peer.Name {
				t.Fatalf("greeted by %q, want %s", name, peer.Name)
			}
			snap := make(chan Direction, 1)
			go func() { time.Sleep(time.Second); snap <- egress() }()
			n, err := streamEcho(c, r, 3*time.Second, 21)
			c.Close()
			if err != nil {
				t.Fatalf("same-node stream: %v", err)
			}
			before, after := <-snap, egress()
			share, all := fastShare(before, after)
			t.Logf("%s: %d bytes echoed pod to pod on one node; after learning %.2f%% of %d packets fast (%v)", mode, n, 100*share, all, after)
			if share < 0.99 || after["local"]-before["local"] < all*99/100 {
				t.Fatalf("same-node packets on the fast path after learning: %.2f%% of %d, local hits %d", 100*share, all, after["local"]-before["local"])
			}

			// Service default/three: a same-node backend, a remote one and the client itself.
			svc := l.Services[1]
			kind := map[string]string{}
			for _, be := range svc.Backends {
				switch {
				case be.Node == client.Name:
					kind[be.Node] = "hairpin"
				case strings.HasPrefix(be.Node, "h1-"):
					kind[be.Node] = "local"
				default:
					kind[be.Node] = "remote"
				}
			}
			if len(kind) != 3 || !containsAll(kind, "hairpin", "local", "remote") {
				t.Fatalf("Service %s's backends %v: the test needs a same-node one, a remote one and the client", svc.Name, svc.Backends)
			}
			done := map[string]bool{}
			for try := 0; try < 60 && len(done) < 3; try++ {
				b := egress()
				c, r, name := labtest.DialNamed(t, client.Netns, svc.Target(), 20*time.Second)
				k, ok := kind[name]
				if !ok {
					t.Fatalf("answered by %q, not a backend of %s", name, svc.Name)
				}
				if done[k] {
					closeSettled(c, r)
					continue
				}
				n, err := streamEcho(c, r, 1500*time.Millisecond, uint64(try))
				closeSettled(c, r)
				if err != nil {
					t.Fatalf("%s backend %s via %s: %v", k, name, svc.Target(), err)
				}
				a := egress()
				hit, local, nat := a["hit"]-b["hit"], a["local"]-b["local"], a["nat"]-b["nat"]
				t.Logf("%s: %s backend %s: %d bytes echoed; client node egress hits %d (local %d), nat %d", mode, k, name, n, hit, local, nat)
				switch k {
				case "local":
					if share, all := fastShare(b, a); local < 100 || share < 0.95 {
						t.Fatalf("same-node backend: local hits %d, %.2f%% of %d packets fast", local, 100*share, all)
					}
				case "remote":
					if hit < 100 || local != 0 {
						t.Fatalf("remote backend: hits %d, local %d", hit, local)
					}
				case "hairpin":
					if nat < 10 || hit != 0 {
						t.Fatalf("hairpin: nat %d (want its packets counted), hits %d (want 0)", nat, hit)
					}
				}
				done[k] = true
			}
			if len(done) < 3 {
				t.Fatalf("only %v of the backends answered in 60 connections", done)
			}

			// NodePort from a pod: the client node's own address, port ServiceNodePort, DNATs
			// to default/one's backend on the other node and kube-proxy masquerades it to the
			// node's address: works, stays on the normal path, counted "nat".
			one := l.Services[0]
			b := egress()
			c, r, name = labtest.DialNamed(t, client.Netns, fmt.Sprintf("%s:%d", l.Hosts[0].AddrOnly(), lab.ServiceNodePort), 20*time.Second)
			if name != one.Backends[0].Node {
				t.Fatalf("NodePort: greeted by %q, want %s", name, one.Backends[0].Node)
			}
			if n, err = streamEcho(c, r, 1500*time.Millisecond, 99); err != nil {
				t.Fatalf("NodePort stream: %v", err)
			}
			c.Close()
			a := egress()
			t.Logf("%s: NodePort: %d bytes echoed; client node egress hits %d, nat %d", mode, n, a["hit"]-b["hit"], a["nat"]-b["nat"])
			if a["nat"]-b["nat"] < 10 || a["hit"] != b["hit"] {
				t.Fatalf("NodePort from a pod: nat %d, hits %d (want counted nat, no hit)", a["nat"]-b["nat"], a["hit"]-b["hit"])
			}
		})
	}
}

func containsAll(m map[string]string, vs ...string) bool {
	have := map[string]bool{}
	for _, v := range m {
		have[v] = true
	}
	for _, v := range vs {
		if !have[v] {
			return false
		}
	}
	return true
}

// TestSameNodeServiceConntrackFlush: a Service connection whose one backend is on the client's
// node (h2-c2 to default/one, backend h2-c1) survives conntrack flushed twice mid-stream: the
// backend's replies are re-learned only after the client's packets re-created the entry with
// its translation, so no reply reaches the client untranslated. Byte-exact, delivered pod to pod.
func TestSameNodeServiceConntrackFlush(t *testing.T) {
	spec := lab.Spec{Name: "fpsnct", Style: lab.StyleFlannel, Containers: 2, Services: true, ProxyMode: lab.ProxyNFTables}
	l, hosts := serviceLab(t, spec)
	attachAll(t, hosts)
	client, err := l.Node("h2-c2")
	if err != nil {
		t.Fatal(err)
	}
	svc := l.Services[0] // default/one: its one backend is h2-c1
	if svc.Backends[0].Node != "h2-c1" {
		t.Fatalf("default/one's backend is %s, the test needs h2-c1", svc.Backends[0].Node)
	}
	n := echoAcrossFlushes(t, client.Netns, svc.Target(), hosts, 12)
	v, err := Inspect(hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes echoed across two conntrack flushes; node egress %v", n, v.Egress)
	if v.Egress["local"] < 1000 {
		t.Fatalf("the stream hardly went pod to pod (local hits %d)", v.Egress["local"])
	}
}

// closeSettled ends connection c (r reads it) and waits until its closing handshake is over:
// the client's last ACK (of the server's FIN) is a plain ACK of a learned flow, which the
// fast path carries, and must land in this connection's counter window, not the next one's.
func closeSettled(c net.Conn, r io.Reader) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, _ = io.Copy(io.Discard, r) // until the server's FIN
	}
	c.Close()
	time.Sleep(100 * time.Millisecond) // the ACK of that FIN leaves in softirq, after the wake-up
}
