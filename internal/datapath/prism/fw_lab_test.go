package prism

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// fwPort is the HP port the firewall tests deny and allow.
const fwPort = 5401

// fwRule adds (-I: first in FORWARD) an iptables rule dropping proto to fwPort in ns, and
// returns its removal (also registered as cleanup; a second removal is a no-op).
func fwRule(t *testing.T, ns, proto string) func() {
	t.Helper()
	return labtest.FirstRule(t, ns, "iptables", "FORWARD", "-p", proto, "--dport", strconv.Itoa(fwPort), "-j", "DROP")
}

// tcpEcho serves TCP echo on addr:fwPort in ns until the test ends.
func tcpEcho(t *testing.T, ns, addr string) {
	t.Helper()
	labtest.EchoTCP(t, ns, net.JoinHostPort(addr, strconv.Itoa(fwPort)))
}

func dialFW(ns, addr string, timeout time.Duration) (net.Conn, error) {
	return netnsutil.DialContext(context.Background(), ns, &net.Dialer{Timeout: timeout}, "tcp4", net.JoinHostPort(addr, strconv.Itoa(fwPort)))
}

// pinger exchanges 64-byte messages over c every 2 ms until stop or an error, recording the
// time of the last echo that came back.
type pinger struct {
	ok   atomic.Int64
	last atomic.Int64 // unix ns of the last echo
	done chan error
	stop chan struct{}
}

func startPinger(c net.Conn) *pinger {
	buf := make([]byte, 64)
	return runPinger(c, func() (bool, error) {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(buf); err != nil {
			return false, err
		}
		_, err := io.ReadFull(c, buf)
		return err == nil, err
	})
}

// runPinger calls exchange every 2 ms until stop, recording each answered one; an exchange's
// error ends the run (done gets it).
func runPinger(c io.Closer, exchange func() (bool, error)) *pinger {
	p := &pinger{done: make(chan error, 1), stop: make(chan struct{})}
	go func() {
		defer c.Close()
		for {
			select {
			case <-p.stop:
				p.done <- nil
				return
			case <-time.After(2 * time.Millisecond):
			}
			ok, err := exchange()
			if err != nil {
				p.done <- err
				return
			}
			if ok {
				p.ok.Add(1)
				p.last.Store(time.Now().UnixNano())
			}
		}
	}()
	return p
}

// TestLabFirewall: prism refuses what FORWARD denies, as vanilla does; redirects what it
// accepts once established; survives a conntrack flush; stops a flow a new DROP rule denies
// within the gate's window.
func TestLabFirewall(t *testing.T) {
	for _, style := range []string{lab.StyleFlannel, lab.StyleDocker} {
		t.Run(style, func(t *testing.T) {
			requireTools(t, "iptables", "conntrack", "nft")
			l := labtest.Up(t, lab.Spec{Name: "tprfw" + style[:2], Style: style, Containers: 1})
			h2 := l.Hosts[1].Netns
			fwNS := h2 // flannel: FORWARD of the host, where flannel.1 and cni0 are
			if style == lab.StyleDocker {
				fwNS = labtest.NS(l, "h2-ov") // docker: the overlay namespace's bridge, via br_netfilter
				if v, err := netnsutil.ReadFileIn(fwNS, "/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil || strings.TrimSpace(v) != "1" {
					t.Skipf("bridged frames skip iptables in %s (bridge-nf-call-iptables %q, %v)", fwNS, v, err)
				}
			}
			c11, _ := l.Node("h1-c1")
			c21, _ := l.Node("h2-c1")
			dst := c21.AddrOnly()
			tcpEcho(t, c21.Netns, dst)
			udpEcho(t, c21.Netns, dst, fwPort)

			// Vanilla with the DROP rules: the connection and the datagram time out.
			delTCP, delUDP := fwRule(t, fwNS, "tcp"), fwRule(t, fwNS, "udp")
			denied := func(what string) {
				t.Helper()
				if c, err := dialFW(c11.Netns, dst, time.Second); err == nil {
					c.Close()
					t.Fatalf("%s: TCP connect to a port FORWARD drops succeeded", what)
				}
				if err := udpOnce(c11.Netns, dst, fwPort, 500*time.Millisecond); err == nil {
					t.Fatalf("%s: UDP to a port FORWARD drops came back", what)
				}
			}
			denied("vanilla")
			if _, err := datapath.Attach(context.Background(), h2, Name, datapath.Options{Extra: map[string]string{OptRules: "proto=tcp dport=5401; proto=udp dport=5401"}}); err != nil {
				t.Fatal(err)
			}
			labtest.DetachAtEnd(t, h2)
			b := inspect(t, h2).Stats
			denied("prism")
			if a := inspect(t, h2).Stats; a.Redirected != b.Redirected || a.HP == b.HP {
				t.Fatalf("denied traffic: HP %d -> %d, redirected %d -> %d", b.HP, a.HP, b.Redirected, a.Redirected)
			}

			// Allowed: established flows are redirected, UDP once its first datagram went through.
			delTCP()
			delUDP()
			b = inspect(t, h2).Stats
			pingPong(t, c11.Netns, dst, fwPort, 50)
			if s := inspect(t, h2).Stats; s.Redirected-b.Redirected < 40 || s.Delivered == b.Delivered {
				t.Errorf("UDP ping-pong: %d of 50 redirected, %d delivered by the normal path", s.Redirected-b.Redirected, s.Delivered-b.Delivered)
			}
			c, err := dialFW(c11.Netns, dst, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			b = inspect(t, h2).Stats
			p := startPinger(c)
			t.Cleanup(func() { close(p.stop) })
			labtest.Eventually(t, 3*time.Second, "established HP flow redirected", func() (bool, string) {
				s := inspect(t, h2).Stats
				return s.Redirected-b.Redirected > 200 && p.ok.Load() > 200, fmt.Sprintf("echoes %d, %+v", p.ok.Load(), s)
			})
			if s := inspect(t, h2).Stats; s.Probe == b.Probe {
				t.Errorf("no re-verification counted: %+v", s)
			}

			// Conntrack flushed mid-flow: the flow goes on (the normal path re-creates the entry)
			// and is redirected again.
			if out, err := netnsutil.Run(context.Background(), fwNS, "conntrack", "-F"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			n0, b := p.ok.Load(), inspect(t, h2).Stats
			labtest.Eventually(t, 3*time.Second, "redirected again after conntrack -F", func() (bool, string) {
				s := inspect(t, h2).Stats
				return p.ok.Load()-n0 > 200 && s.Redirected-b.Redirected > 100, fmt.Sprintf("echoes %d, %+v", p.ok.Load()-n0, s)
			})

			// A DROP added mid-flow stops the established flow within the gate's window.
			fwRule(t, fwNS, "tcp")
			added := time.Now()
			select {
			case err := <-p.done:
				if err == nil {
					t.Fatal("pinger stopped")
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the established flow still runs 5 s after a DROP rule (echoes %d)", p.ok.Load())
			}
			stopped := time.Unix(0, p.last.Load()).Sub(added)
			t.Logf("%s: TCP: DROP added mid-flow: last echo %v after the rule (bound %v)", style, stopped, windowFactor*defaultVerify)
			if stopped > windowFactor*defaultVerify+100*time.Millisecond {
				t.Errorf("TCP: the flow ran %v after the DROP rule; bound %v", stopped, windowFactor*defaultVerify)
			}

			// UDP: a lost datagram does not stall the others, so this measures the window itself.
			u := startUDPPinger(t, c11.Netns, dst)
			labtest.Eventually(t, 3*time.Second, "UDP flow running", func() (bool, string) { return u.ok.Load() > 100, fmt.Sprint(u.ok.Load()) })
			fwRule(t, fwNS, "udp")
			added = time.Now()
			time.Sleep(2 * time.Second)
			close(u.stop)
			<-u.done
			stopped = time.Unix(0, u.last.Load()).Sub(added)
			t.Logf("%s: UDP: DROP added mid-flow: last echo %v after the rule (bound %v)", style, stopped, windowFactor*defaultVerify)
			if stopped > windowFactor*defaultVerify+100*time.Millisecond {
				t.Errorf("UDP: the flow ran %v after the DROP rule; bound %v", stopped, windowFactor*defaultVerify)
			}
		})
	}
}

// startUDPPinger sends a datagram from ns to addr:fwPort every 2 ms and records the time of the
// last echo (each waits at most 50 ms), until stop.
func startUDPPinger(t *testing.T, ns, addr string) *pinger {
	t.Helper()
	c, err := dialUDPIn(ns, addr, fwPort)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 128)
	return runPinger(c, func() (bool, error) {
		_ = c.SetDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Write([]byte("ping")); err != nil {
			return false, nil // a refused datagram is a miss, not the end
		}
		_, err := c.Read(buf)
		return err == nil, nil
	})
}

// udpOnce sends one datagram from ns to addr:port and waits timeout for the echo.
func udpOnce(ns, addr string, port int, timeout time.Duration) error {
	c, err := dialUDPIn(ns, addr, port)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 64))
	return err
}
