package fastpath

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestSameNodeServiceIPv6 (issue 29 item 3, same-node IPv6 Services): on a dual-stack lab with
// Services (lab up --ipv6 --services), in each proxy mode, pod h2-c2 streams to default/one's
// IPv6 ClusterIP, whose one backend (h2-c1) is on its own node, with the fast path attached:
// the backend greets, the echo is byte-exact past the first re-learn (5 s: the reply flow waits
// for the client's), and after learning >= 99 % of the node's packets of it go pod to pod,
// translated both ways ("local" hits: the client's DNAT and the backend's replies with the
// Service as source, bpf/fastpath_local6.h), none dropped. Then 10 short connections are each
// answered and echoed. Detach leaves no program, record, pin or map, and the Service still
// answers over IPv6.
func TestSameNodeServiceIPv6(t *testing.T) {
	for _, mode := range []string{lab.ProxyIPTables, lab.ProxyNFTables} {
		t.Run(mode, func(t *testing.T) {
			l := labForTest(t, lab.Spec{Name: "fpsl6" + mode[:2], Style: lab.StyleFlannel, Containers: 2,
				Services: true, ProxyMode: mode, IPv6: true})
			hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
			svc := l.Services[0] // default/one: its one backend is h2-c1
			if svc.ClusterIP6 == "" || svc.Backends[0].Node != "h2-c1" {
				t.Fatalf("default/one: %+v", svc)
			}
			be, err := l.Node("h2-c1")
			if err != nil {
				t.Fatal(err)
			}
			client, err := l.Node("h2-c2") // the backend's node mate
			if err != nil {
				t.Fatal(err)
			}
			ln, err := netnsutil.Listen(be.Netns, "tcp6", net.JoinHostPort(be.Addr6Only(), strconv.Itoa(lab.VerifyPort)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go lab.ServeTCPEchoFor(ln, be.Name, 0)
			attachAll(t, hosts)
			node := hosts[1]
			dial := func() net.Conn {
				t.Helper()
				c, err := netnsutil.DialContext(context.Background(), client.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", svc.Target6())
				if err != nil {
					t.Fatal(err)
				}
				return c
			}

			c := dial()
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a stalled flow fails the test, not hangs it
			r, name, err := labtest.ReadGreeting(c)
			if err != nil || name != be.Name {
				t.Fatalf("%s answered by %q (%v), want %s", svc.Target6(), name, err, be.Name)
			}
			snap := make(chan Direction, 1)
			go func() {
				time.Sleep(time.Second) // learned by then: the handshake and the first segments
				eg, _ := counters(t, node)
				snap <- eg
			}()
			n, err := streamEcho(c, r, 7*time.Second, 61) // past the first re-learn (5 s)
			c.Close()
			if err != nil {
				t.Fatalf("stream via %s to %s: %v (%d bytes echoed)", svc.Target6(), name, err, n)
			}
			before := <-snap
			after, _ := counters(t, node)
			share, all := fastShare(before, after)
			local := after["local"] - before["local"]
			t.Logf("%s: %d bytes echoed byte-exact via %s to a same-node backend; after learning %.2f%% of %d packets fast, %d local (egress %v)",
				mode, n, svc.Target6(), 100*share, all, local, after)
			if all == 0 || share < 0.99 || local < all*99/100 {
				t.Errorf("same-node IPv6 Service stream on the fast path: %.2f%% of %d packets, local hits %d (want >= 99%%)", 100*share, all, local)
			}
			if after["dropped"] != before["dropped"] || after["nat"] != before["nat"] {
				t.Errorf("dropped or left untranslated: %v -> %v", before, after)
			}

			// Short connections: each answered by the backend and echoed to its FIN.
			for i := 0; i < 10; i++ {
				c := dial()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				r, name, err := labtest.ReadGreeting(c)
				token := []byte("prg same-node short connection " + strconv.Itoa(i))
				if err == nil {
					_, err = c.Write(token)
				}
				if err == nil {
					err = c.(*net.TCPConn).CloseWrite()
				}
				var got []byte
				if err == nil {
					got, err = io.ReadAll(r)
				}
				c.Close()
				if err != nil || name != be.Name || string(got) != string(token) {
					t.Fatalf("short connection %d via %s: answered by %q, echo %q, %v", i, svc.Target6(), name, got, err)
				}
			}

			ids := pinnedMapIDs(t, node)
			detachLeavesNothing(t, hosts...)
			labtest.MapsGone(t, ids)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if got, err := lab.ServiceEcho(ctx, client.Netns, svc.Target6()); err != nil || got != be.Name {
				t.Fatalf("after detach, %s: answered by %q, %v", svc.Target6(), got, err)
			}
		})
	}
}
