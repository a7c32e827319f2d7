package fastpath

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// TestLabIPv6ConntrackDelete: `conntrack -D` of a learned IPv6 connection's entry on the
// client's node reaches its cached flow within a second (the agent's DESTROY watch; before,
// only at the 5 s re-learn): the flow is made due (its learn times cleared), and the
// connection still echoes byte-exact afterwards.
func TestLabIPv6ConntrackDelete(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fp6d", Style: lab.StyleFlannel, Containers: 1, IPv6: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	target := net.JoinHostPort(c2.Addr6Only(), strconv.Itoa(lab.VerifyPort))
	ln, err := netnsutil.Listen(c2.Netns, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go lab.ServeTCPEchoFor(ln, c2.Name, 0)
	attachAll(t, hosts)
	// Conntrack tracks the namespace's IPv6 once a rule needs it: kube-proxy's INVALID drop.
	for _, h := range hosts {
		run(t, h, "ip6tables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	c, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
		t.Fatalf("greeting %q, %v", line, err)
	}
	// The connection stays open (no FIN): echo rounds of 16 KiB, checked byte for byte.
	echo := func(what string, seed byte) {
		for i := range 20 {
			msg := bytes.Repeat([]byte{seed + byte(i)}, 16<<10)
			if _, err := c.Write(msg); err != nil {
				t.Fatalf("%s: write: %v", what, err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("%s: echo round %d: %v, byte-exact %v", what, i, err, bytes.Equal(got, msg))
			}
		}
	}
	echo("stream", 'a')
	lp := netip.MustParseAddrPort(c.LocalAddr().String())
	local, remote := flow.AddrWords(netip.MustParseAddr(c1.Addr6Only())), flow.AddrWords(netip.MustParseAddr(c2.Addr6Only()))
	learned := func() (found, due bool) {
		p, err := openPinned(hosts[0])
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		_ = walkFlows6(p.PrgFastpathFlow6, func(k fpFpKey6, f *fpFpFlow) {
			if k.Local == local && k.Remote == remote && k.Lport == htons(lp.Port()) && k.Proto == 6 {
				found = true
				due = f.OutNs == 0 && f.InNs == 0
			}
		})
		return
	}
	if found, due := learned(); !found || due {
		t.Fatalf("%s: the stream's IPv6 flow: cached %v, due %v; want cached and not due", hosts[0], found, due)
	}
	out := run(t, hosts[0], "conntrack", "-D", "-f", "ipv6", "-p", "tcp", "--orig-src", c1.Addr6Only(),
		"--orig-dst", c2.Addr6Only(), "--sport", strconv.Itoa(int(lp.Port())))
	deleted := time.Now()
	for {
		if found, due := learned(); found && due {
			t.Logf("the IPv6 flow was due %v after the deletion (%s)", time.Since(deleted).Round(time.Millisecond), strings.TrimSpace(out))
			break
		}
		if time.Since(deleted) > time.Second {
			t.Fatalf("%s: the IPv6 flow not due 1 s after its conntrack entry was deleted (%s)", hosts[0], out)
		}
		time.Sleep(5 * time.Millisecond)
	}
	echo("stream after the deletion", 'A')
}
