package prism

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// invalidDrop puts kube-proxy's `KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP` (lab
// --services writes the same rule, internal/lab/services.go) first in FORWARD of ns and returns
// a reader of its packet counter; the rule goes when the test ends.
func invalidDrop(t *testing.T, ns string) func() uint64 {
	t.Helper()
	labtest.FirstRule(t, ns, "iptables", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	return func() uint64 {
		out, err := netnsutil.Run(context.Background(), ns, "iptables", "-w", "-L", "FORWARD", "-v", "-n", "-x")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[2] == "DROP" && strings.Contains(line, "INVALID") {
				n, err := strconv.ParseUint(f[0], 10, 64)
				if err != nil {
					t.Fatalf("counter of %q: %v", line, err)
				}
				return n
			}
		}
		t.Fatalf("no INVALID drop rule in FORWARD of %s:\n%s", ns, out)
		return 0
	}
}

// TestLabHPTCPPastInvalidDrop is the k8s lab's prism bug in peregrine's flannel lab: with an
// INVALID drop in FORWARD (kube-proxy's) on both hosts and prism redirecting a TCP ping-pong both
// ways, conntrack saw only part of the stream, called the pod's next acks INVALID and the rule
// dropped them: one retransmission timeout (≥ 200 ms) per exchange. Now the gate redirects a TCP
// flow only once the agent made its one conntrack entry liberal: the exchanges finish at normal
// speed, most of them redirected, with no INVALID drop, and the namespaces' be_liberal stays 0.
func TestLabHPTCPPastInvalidDrop(t *testing.T) {
	requireTools(t, "iptables")
	l := labtest.Up(t, lab.Spec{Name: "tprinv", Style: lab.StyleFlannel, Containers: 1})
	h1, h2 := l.Hosts[0].Netns, l.Hosts[1].Netns
	c11, _ := l.Node("h1-c1")
	c21, _ := l.Node("h2-c1")
	dst := net.JoinHostPort(c21.AddrOnly(), strconv.Itoa(hpPort))
	labtest.EchoTCP(t, c21.Netns, dst)
	drops := []func() uint64{invalidDrop(t, h1), invalidDrop(t, h2)}
	for _, h := range []string{h1, h2} {
		if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{Extra: map[string]string{OptRules: hpRules}}); err != nil {
			t.Fatal(err)
		}
	}
	labtest.DetachAtEnd(t, h1, h2)
	redirected := func() (n uint64) {
		for _, h := range []string{h1, h2} {
			v, err := Inspect(h)
			if err != nil {
				t.Fatal(err)
			}
			n += v.Stats.Redirected
			t.Logf("%s: redirected %d, TCP entry not yet liberal %d, asks lost %d", netnsutil.Label(h), v.Stats.Redirected, v.Stats.Strict, v.Stats.AskLost)
		}
		return n
	}
	d0 := []uint64{drops[0](), drops[1]()}
	r0 := redirected()

	c, err := netnsutil.DialContext(context.Background(), c11.Netns, &net.Dialer{Timeout: 2 * time.Second}, "tcp4", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 1000 exchanges take well under a second at normal speed on the 2-vCPU VM; ten stalls of one
	// RTO each would take 2 s.
	const n, bound = 1000, 4 * time.Second
	start := time.Now()
	_ = c.SetDeadline(start.Add(bound))
	buf := make([]byte, 64)
	done := 0
	for ; done < n; done++ {
		buf[0] = byte(done)
		if _, err := c.Write(buf); err != nil {
			break
		}
		if _, err := io.ReadFull(c, buf); err != nil || buf[0] != byte(done) {
			break
		}
	}
	took := time.Since(start)
	dd := []uint64{drops[0]() - d0[0], drops[1]() - d0[1]}
	red := redirected() - r0
	t.Logf("%d of %d exchanges in %v; HP frames redirected %d; INVALID drops h1 %d, h2 %d", done, n, took.Round(time.Millisecond), red, dd[0], dd[1])
	if done < n {
		t.Errorf("only %d of %d exchanges within %v (a stall per exchange is the INVALID drop)", done, n, bound)
	}
	if dd[0]+dd[1] != 0 {
		t.Errorf("the INVALID rule dropped %d packets on h1 and %d on h2", dd[0], dd[1])
	}
	if red < n { // 2n HP frames, each way from the first exchanges on
		t.Errorf("only %d of %d HP frames redirected: the fix must not just keep HP TCP on the normal path", red, 2*n)
	}
	for _, h := range []string{h1, h2} {
		if v, err := netnsutil.ReadFileIn(h, "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"); err != nil || strings.TrimSpace(v) != "0" {
			t.Errorf("%s: nf_conntrack_tcp_be_liberal %q (%v): only the HP flows' entries may be liberal", h, v, err)
		}
	}
}
