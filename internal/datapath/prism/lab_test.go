package prism

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The tests attach modes whose agents are started as this test binary.
func TestMain(m *testing.M) { agenttest.Main(m) }

const (
	hpPort = 11111
	lpPort = 22222
)

// hpRules make the ping-pong port and ICMP high priority in both directions.
const hpRules = "proto=tcp dport=11111; proto=tcp sport=11111; proto=udp dport=11111; proto=udp sport=11111; proto=icmp"

// udpEcho serves UDP echo in ns on port, replying with the TTL the datagram arrived with.
func udpEcho(t *testing.T, ns, addr string, port int) {
	t.Helper()
	c := labtest.ListenUDP(t, ns, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
	raw, _ := c.SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1) })
	go func() {
		buf := make([]byte, 2048)
		oob := make([]byte, 128)
		for {
			n, oobn, _, from, err := c.ReadMsgUDP(buf, oob)
			if err != nil {
				return
			}
			ttl := byte(0)
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL && len(m.Data) >= 1 {
						ttl = m.Data[0]
					}
				}
			}
			_, _ = c.WriteToUDP(append([]byte{ttl}, buf[:n]...), from)
		}
	}()
}

// pingPong sends n datagrams from ns to addr:port one at a time and returns the TTLs the
// server saw; every echo must come back intact.
func pingPong(t *testing.T, ns, addr string, port, n int) []byte {
	t.Helper()
	c, err := dialUDPIn(ns, addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ttls []byte
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("ping %d", i))
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("ping-pong to %s:%d, message %d: %v", addr, port, i, err)
		}
		if !bytes.Equal(buf[1:k], msg) {
			t.Fatalf("echo %q, want %q", buf[1:k], msg)
		}
		ttls = append(ttls, buf[0])
	}
	return ttls
}

// bulkTCP sends size random bytes over TCP on lpPort and checks they arrive intact.
func bulkTCP(t *testing.T, srvNS, cliNS, addr string, size int) {
	t.Helper()
	ln, err := netnsutil.Listen(srvNS, "tcp4", fmt.Sprintf("%s:%d", addr, lpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- [32]byte{}
			return
		}
		defer c.Close()
		h := sha256.New()
		_, _ = io.Copy(h, c)
		var s [32]byte
		copy(s[:], h.Sum(nil))
		got <- s
	}()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	c, err := netnsutil.DialContext(context.Background(), cliNS, &net.Dialer{Timeout: 3 * time.Second}, "tcp4", fmt.Sprintf("%s:%d", addr, lpPort))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case s := <-got:
		if s != sha256.Sum256(data) {
			t.Fatal("bulk TCP data corrupted")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("bulk TCP transfer did not finish")
	}
}

func inspect(t *testing.T, host string) *View {
	t.Helper()
	v, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLabEndToEnd(t *testing.T) {
	for _, style := range []string{lab.StyleDocker, lab.StyleFlannel} {
		t.Run(style, func(t *testing.T) {
			l := labtest.Up(t, lab.Spec{Name: "tpr" + style[:2], Style: style, Containers: 2})
			h1, h2 := l.Hosts[0].Netns, l.Hosts[1].Netns
			c11, _ := l.Node("h1-c1")
			c21, _ := l.Node("h2-c1")
			c22, _ := l.Node("h2-c2")
			dst := c21.AddrOnly()
			udpEcho(t, c21.Netns, dst, hpPort)
			udpEcho(t, c21.Netns, dst, lpPort)
			// The normal path's TTLs, before prism.
			vanillaTTL := pingPong(t, c11.Netns, dst, hpPort, 5)

			for _, h := range []string{h1, h2} {
				if _, err := datapath.Attach(context.Background(), h, "prism", datapath.Options{Extra: map[string]string{OptRules: hpRules}}); err != nil {
					t.Fatal(err)
				}
			}
			v := inspect(t, h2)
			if len(v.Rules) != 5 || len(v.Endpoints) != 2 {
				t.Fatalf("h2: %d rules, endpoints %+v", len(v.Rules), v.Endpoints)
			}
			if !strings.Contains(v.Agent, "running") {
				t.Errorf("agent: %s", v.Agent)
			}
			before := v.Stats
			hpTTL := pingPong(t, c11.Netns, dst, hpPort, 200)
			lpTTL := pingPong(t, c11.Netns, dst, lpPort, 50)
			after := inspect(t, h2)
			// The flow's first datagram takes the normal path: the firewall gate waits for
			// conntrack's confirmation.
			if got := after.Stats.Redirected - before.Redirected; got < 195 {
				t.Errorf("h2 redirected %d HP packets, want >= 195: %+v", got, after.Stats)
			}
			if after.Rules[2].Packets < 200 {
				t.Errorf("rule udp dport=11111 counted %d, want >= 200", after.Rules[2].Packets)
			}
			// The receiving socket sees the same IP header on the fast and the normal path.
			for _, ttl := range append(hpTTL, lpTTL...) {
				if ttl != vanillaTTL[0] {
					t.Fatalf("TTL at the receiver %d, normal path %d (HP %v)", ttl, vanillaTTL[0], hpTTL[:3])
				}
			}
			// Bulk (LP) traffic is correct and not redirected.
			redir := inspect(t, h2).Stats.Redirected
			bulkTCP(t, c21.Netns, c11.Netns, dst, 8<<20)
			if d := inspect(t, h2).Stats.Redirected - redir; d > 5 {
				t.Errorf("bulk TCP on an LP port was redirected (%d packets)", d)
			}
			// ICMP is HP too: ping works through the fast path.
			if out, err := netnsutil.Run(context.Background(), c11.Netns, "ping", "-c", "3", "-i", "0.2", "-w", "5", dst); err != nil {
				t.Errorf("ping: %v\n%s", err, out)
			}

			// A container vanishes while its flows are HP: its HP packets are dropped and counted.
			vanishedIP := c22.AddrOnly()
			if err := netnsutil.Delete(c22.Netns); err != nil {
				t.Fatal(err)
			}
			waitGone(t, l, "veth2") // the kernel destroys a namespace's devices asynchronously
			b := inspect(t, h2).Stats
			udpBurst(t, c11.Netns, vanishedIP, hpPort, 20, 64)
			a := labtest.Settled(2*time.Second, func() Stats { return inspect(t, h2).Stats })
			if dropped := (a.Gone + a.Stale) - (b.Gone + b.Stale); dropped == 0 {
				t.Errorf("HP packets to a vanished container were not dropped and counted: %+v", a)
			}
			if a.Redirected != b.Redirected {
				t.Errorf("HP packets to a vanished container were redirected")
			}
			// The agent turns the endpoint into a tombstone within a second.
			labtest.Eventually(t, time.Second, "vanished container marked gone", func() (bool, string) {
				eps := inspect(t, h2).Endpoints
				for _, e := range eps {
					if e.Addr == vanishedIP && e.Gone {
						return true, ""
					}
				}
				return false, fmt.Sprintf("endpoints %+v", eps)
			})

			// Rules change live: without the UDP rules the ping-pong takes the normal path.
			if _, err := DelRules(h2, []string{"proto=udp dport=11111"}); err != nil {
				t.Fatal(err)
			}
			r0 := inspect(t, h2).Stats.Redirected
			pingPong(t, c11.Netns, dst, hpPort, 20)
			if d := inspect(t, h2).Stats.Redirected - r0; d != 0 {
				t.Errorf("%d packets redirected after the rule was deleted", d)
			}
			if _, err := AddRules(h2, "proto=udp dport=11111"); err != nil {
				t.Fatal(err)
			}
			if _, err := AddRules(h2, "proto=udp dport=11111"); err == nil {
				t.Error("a duplicate rule was accepted")
			}
			if _, err := AddRules(h2, "dst=198.19.0.0/33"); err == nil {
				t.Error("a bad CIDR was accepted")
			}

			for _, h := range []string{h1, h2} {
				if _, err := datapath.Detach(context.Background(), h, ""); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(datapath.PinDir(h)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("pins left after detach: %v", err)
				}
			}
			pingPong(t, c11.Netns, dst, hpPort, 5)
		})
	}
}

// waitGone waits until the bridge-side veth of a deleted container is unregistered.
func waitGone(t *testing.T, l *lab.Lab, veth string) {
	t.Helper()
	ns := l.Hosts[1].Netns
	if l.Spec.Style == lab.StyleDocker {
		ns = lab.NsPrefix(l.Spec.Name) + "h2-ov"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		_ = netnsutil.Do(ns, func() error { _, err = net.InterfaceByName(veth); return nil })
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s still exists 10 s after its container's namespace was deleted", ns, veth)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialUDPIn opens a UDP socket in ns connected to addr:port (it keeps its namespace after Do).
func dialUDPIn(ns, addr string, port int) (c *net.UDPConn, err error) {
	err = netnsutil.Do(ns, func() error {
		c, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		return err
	})
	return c, err
}

// udpBurst sends n datagrams of size bytes from ns to addr:port at a modest rate (no drops).
func udpBurst(t *testing.T, ns, addr string, port, n, size int) {
	t.Helper()
	if err := netnsutil.Do(ns, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			_, _ = c.Write(make([]byte, size))
			if i%20 == 19 {
				time.Sleep(time.Millisecond)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAttachRefusesBadRules(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tprbad", Style: lab.StyleDocker})
	for _, bad := range []string{"dst=198.19.0.0/33", "dport=70000", "proto=foo", "proto=icmp dport=1", "src=10.0.0.0/8 dst=fd00::/8"} {
		_, err := datapath.Attach(context.Background(), l.Hosts[1].Netns, "prism", datapath.Options{Extra: map[string]string{OptRules: bad}})
		if err == nil {
			t.Errorf("rule %q accepted", bad)
		}
		if st, _ := datapath.LoadState(l.Hosts[1].Netns, "prism"); st != nil {
			t.Fatalf("refused attach left a record")
		}
	}
}

// The agent puts prg_prism_vx on a VXLAN device created after attach within a second, and
// forgets it (link pin and record) once the device is deleted.
func TestAgentFollowsNewVXLANDevice(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tprvx", Style: lab.StyleFlannel, Containers: 1})
	host := l.Hosts[0].Netns
	if _, err := datapath.Attach(context.Background(), host, Name, datapath.Options{Extra: map[string]string{OptRules: hpRules}}); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, host)
	idx := labtest.AddVXLAN(t, host, "prgvx2", 77, 4790, "eth0")
	recorded := func() (piece, bool) {
		st, err := datapath.Attached(host, Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ms.Pieces {
			if p.Dev.Name == "prgvx2" {
				return p, true
			}
		}
		return piece{}, false
	}
	labtest.Eventually(t, time.Second, "prg_prism_vx on the new VXLAN device", func() (bool, string) {
		progs := bpfobj.ProgramsOn(host, idx, false, "prg_prism_vx")
		_, ok := recorded()
		return len(progs) == 1 && ok, fmt.Sprintf("programs %v, recorded %v", progs, ok)
	})
	p, _ := recorded()
	labtest.DelLink(host, "prgvx2")
	labtest.Eventually(t, 2*time.Second, "the deleted device forgotten", func() (bool, string) {
		_, ok := recorded()
		_, err := os.Stat(p.LinkPin)
		return !ok && os.IsNotExist(err), fmt.Sprintf("recorded %v, link pin %v", ok, err)
	})
}
