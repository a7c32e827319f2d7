package ezpath

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// Issue 28, rule a, for EZPath: an offloaded flow skips the overlay namespace's bridge and
// netfilter, so a DROP added there mid-stream must still stop it within 1 s (the gate: the flow is
// delivered straight to the pod only while the overlay's normal path delivered it lately).

const gatePort = 5406

func TestOffloadedFlowFollowsTheOverlaysFirewall(t *testing.T) {
	l := torLab(t, "ezgate", map[string]string{OptPolicy: "manual"})
	src, _ := l.Node("h1-c1")
	dst, _ := l.Node("h2-c1")
	must(t, Offload("ezgate", "h1-c1", dst.AddrOnly(), "manual"))

	c := labtest.ListenUDP(t, dst.Netns, &net.UDPAddr{IP: net.ParseIP(dst.AddrOnly()), Port: gatePort})
	var n, last atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			n.Add(1)
			last.Store(time.Now().UnixNano())
		}
	}()
	var s *net.UDPConn
	must(t, netnsutil.Do(src.Netns, func() error {
		var err error
		s, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst.AddrOnly()), Port: gatePort})
		return err
	}))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer s.Close()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			_, _ = s.Write(make([]byte, 64))
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()

	// The offloaded flow runs, delivered straight to the pod (after the gate's first look).
	h0, _ := stats(t, l, 2)
	deadline := time.Now().Add(3 * time.Second)
	for {
		h, _ := stats(t, l, 2)
		if n.Load() > 300 && h["delivered"]-h0["delivered"] > 100 && h["gate_delivered"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("offloaded flow: %d datagrams, host counters %v", n.Load(), h)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A DROP in the overlay namespace's bridge, mid-stream.
	ov := lab.NsPrefix("ezgate") + "h2-ov"
	cmd := netnsutil.Command(context.Background(), ov, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("table bridge prg_t {\n chain c {\n  type filter hook postrouting priority 0;\n  ip daddr %s udp dport %d drop\n }\n}\n", dst.AddrOnly(), gatePort))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	defer func() { _, _ = netnsutil.Run(context.Background(), ov, "nft", "delete", "table", "bridge", "prg_t") }()
	added := time.Now()
	n1 := n.Load()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-done
	after := time.Unix(0, last.Load()).Sub(added)
	h, _ := stats(t, l, 2)
	t.Logf("offloaded flow: %d datagrams after a bridge DROP in the overlay namespace, the last %v after it; host counters %v", n.Load()-n1, after.Round(time.Millisecond), h)
	if after > time.Second {
		t.Errorf("offloaded datagrams still delivered %v after the DROP (%d in all); rule (a) bounds it at 1 s", after, n.Load()-n1)
	}
}
