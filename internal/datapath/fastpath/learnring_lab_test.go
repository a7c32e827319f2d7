package fastpath

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// ipCTTCPFlagBeLiberal is IP_CT_TCP_FLAG_BE_LIBERAL (conntrack's per-direction TCP flag).
const ipCTTCPFlagBeLiberal = 0x08

// TestLabLiberalFromRing: a TCP connection opened well after attach (the agent's one walk, at its
// start, found nothing) has its conntrack entry made liberal, both directions, on both nodes,
// within about a second of its learn: the learners reported it through prg_fastpath_learned and
// the agent marked what the ring delivered (learnring.go), no walk of the table involved. Its
// close then expires that entry on both nodes in the kernel (closed_expire): the connection
// was handshake-only to conntrack, liberal or not.
func TestLabLiberalFromRing(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fplr", Style: lab.StyleFlannel, Containers: 1})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	target := net.JoinHostPort(c2.AddrOnly(), strconv.Itoa(lab.VerifyPort))
	ln, err := netnsutil.Listen(c2.Netns, "tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go lab.ServeTCPEchoFor(ln, c2.Name, 0)
	for _, h := range hosts { // conntrack tracks the forwarded flow, as under kube-proxy
		labtest.FirstRule(t, h, "iptables", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	attachAll(t, hosts)
	time.Sleep(2 * ctLiberalEvery) // past the agent's first round (its walk)

	c, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
		t.Fatalf("greeting %q, %v", line, err)
	}
	// Echo for a second, the connection left open: streamEcho's half-close would end it (the
	// server closes on EOF), and the close of a handshake-only connection on the fast path
	// expires its entry at once (closed_expire, bpf/fastpath_closed.h): nothing left to check.
	if n, err := echoOpen(c, r, time.Second, 7); err != nil { // learned both ways by then
		t.Fatalf("echo: %v (%d bytes)", err, n)
	}
	lp := c.LocalAddr().(*net.TCPAddr)
	tu := ctnl.Tuple{Src: netip.MustParseAddr(c1.AddrOnly()), Dst: netip.MustParseAddr(c2.AddrOnly()),
		Sport: uint16(lp.Port), Dport: uint16(lab.VerifyPort), Proto: 6}
	for _, h := range hosts {
		var orig, reply uint8
		var found bool
		deadline := time.Now().Add(3 * ctLiberalEvery)
		for {
			orig, reply, found = ctTCPFlags(t, h, tu)
			if orig&reply&ipCTTCPFlagBeLiberal != 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if orig&reply&ipCTTCPFlagBeLiberal == 0 {
			ct, _ := netnsutil.Run(context.Background(), h, "conntrack", "-L", "-p", "tcp")
			t.Fatalf("%s: conntrack entry of %v (found %v): TCP flags %#x/%#x, want liberal both ways\n%s",
				netnsutil.Label(h), tu, found, orig, reply, ct)
		}
		t.Logf("%s: conntrack entry of %v: TCP flags %#x/%#x", netnsutil.Label(h), tu, orig, reply)
	}

	// Closed now (the client's FIN, the server's on EOF), on the fast path: the liberal entry,
	// still SYN_RECV to conntrack, is expired at the close by each node's program.
	expired := func() (n uint64) {
		for _, h := range hosts {
			v, err := Inspect(h)
			if err != nil {
				t.Fatal(err)
			}
			n += v.Egress["closed-ct"] + v.Ingress["closed-ct"]
		}
		return n
	}
	before := expired()
	_ = c.Close()
	for _, h := range hosts {
		deadline := time.Now().Add(2 * time.Second)
		for {
			_, _, found := ctTCPFlags(t, h, tu)
			if !found {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: conntrack entry of %v still there 2 s after the close", netnsutil.Label(h), tu)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n := expired() - before; n != 2 {
		t.Fatalf("closed-ct grew by %d at the close: want 2, one per node (expired in the kernel)", n)
	}
}

// echoOpen sends d's worth of seeded pseudo-random chunks over c, each read back from r and
// checked before the next, and leaves the connection open (streamEcho half-closes it).
func echoOpen(c net.Conn, r io.Reader, d time.Duration, seed uint64) (int64, error) {
	src := rand.NewChaCha8([32]byte{byte(seed)})
	out, in := make([]byte, 16<<10), make([]byte, 16<<10)
	var n int64
	for end := time.Now().Add(d); time.Now().Before(end); {
		_, _ = src.Read(out)
		if _, err := c.Write(out); err != nil {
			return n, err
		}
		if _, err := io.ReadFull(r, in); err != nil {
			return n, err
		}
		if !bytes.Equal(in, out) {
			return n, fmt.Errorf("echo differs within bytes %d-%d", n, n+int64(len(in)))
		}
		n += int64(len(in))
	}
	return n, nil
}

// ctTCPFlags is the TCP flags of conntrack's entry for tu in namespace ns (original, reply).
func ctTCPFlags(t *testing.T, ns string, tu ctnl.Tuple) (orig, reply uint8, found bool) {
	t.Helper()
	s, err := ctnl.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Exchange(ctnl.AppendGet(nil, tu, 1), func(m syscall.NetlinkMessage) {
		if len(m.Data) < sizeofNfgenmsg {
			return
		}
		nlAttrs(m.Data[sizeofNfgenmsg:], func(typ uint16, v []byte) {
			if typ != nl.CTA_PROTOINFO {
				return
			}
			nlAttrs(v, func(typ uint16, v []byte) {
				if typ != nl.CTA_PROTOINFO_TCP {
					return
				}
				nlAttrs(v, func(typ uint16, v []byte) {
					switch {
					case typ == nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL && len(v) >= 1:
						orig, found = v[0], true
					case typ == nl.CTA_PROTOINFO_TCP_FLAGS_REPLY && len(v) >= 1:
						reply = v[0]
					}
				})
			})
		})
	})
	if err != nil {
		t.Fatalf("%s: conntrack entry of %v: %v", netnsutil.Label(ns), tu, err)
	}
	return orig, reply, found
}
