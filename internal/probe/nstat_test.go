package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"golang.org/x/sys/unix"
)

// Cut from /proc/net/snmp and /proc/net/netstat of Linux 6.18 (TcpExt shortened).
const snmpFixture = `Ip: Forwarding DefaultTTL InReceives InHdrErrors
Ip: 2 64 5447 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 38 2 0 0 3 5397 5093 17 0 6 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 49 7 2 50 1 0 0 0 0
`

const netstatFixture = `TcpExt: SyncookiesSent TCPOFOQueue TCPSACKReorder TCPRenoReorder TCPTSReorder TCPDSACKRecv TCPLostRetransmit TCPSpuriousRTOs
TcpExt: 0 120 4 0 9 3 1 2
IpExt: InNoRoutes InOctets OutOctets
IpExt: 0 6123056152 6026014267
`

const snmp6Fixture = `Ip6InReceives                   	1
Ip6InHdrErrors                  	0
Icmp6InMsgs                     	3
Udp6InDatagrams                 	12
UdpLite6InDatagrams             	0
`

func fixtureCounters(t *testing.T) Counters {
	t.Helper()
	c, err := ParseSNMP(strings.NewReader(snmpFixture + netstatFixture))
	if err != nil {
		t.Fatal(err)
	}
	c6, err := ParseSNMP6(strings.NewReader(snmp6Fixture))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c6 {
		c[k] = v
	}
	return c
}

func TestParseNstat(t *testing.T) {
	c := fixtureCounters(t)
	for name, want := range map[string]int64{
		"Udp.NoPorts": 7, "Udp.RcvbufErrors": 1, "Tcp.RetransSegs": 17, "Tcp.MaxConn": -1,
		"TcpExt.TCPOFOQueue": 120, "TcpExt.TCPTSReorder": 9, "IpExt.InOctets": 6123056152,
		"Udp6.InDatagrams": 12, "Icmp6.InMsgs": 3, "UdpLite6.InDatagrams": 0, "Ip6.InReceives": 1,
	} {
		if got, ok := c.Get(name); !ok || got != want {
			t.Errorf("%s = %d (present %v), want %d", name, got, ok, want)
		}
	}
	for _, n := range DefaultCounters {
		if _, ok := c.Get(n); !ok {
			t.Errorf("default counter %s not in fixture", n)
		}
	}
	assertParseFails(t, ParseSNMP, map[string]string{
		"header only":     "Udp: InDatagrams NoPorts\n",
		"count mismatch":  "Udp: InDatagrams NoPorts\nUdp: 1\n",
		"group mismatch":  "Udp: InDatagrams\nTcp: 1\n",
		"not a number":    "Udp: InDatagrams\nUdp: x\n",
		"above int64 max": "Udp: InDatagrams\nUdp: 18446744073709551615\n",
	})
	assertParseFails(t, ParseSNMP6, map[string]string{
		"no group": "InReceives 1\n",
		"3 fields": "Ip6InReceives 1 2\n",
	})
}

func TestCounterDeltas(t *testing.T) {
	a := fixtureCounters(t)
	b := fixtureCounters(t)
	b["Udp.NoPorts"] += 5
	b["TcpExt.TCPOFOQueue"] += 1000
	b["Tcp.CurrEstab"] -= 2 // a gauge: may go down
	d, err := CounterDeltas(a, b, append([]string{"Tcp.CurrEstab"}, DefaultCounters...))
	if err != nil {
		t.Fatal(err)
	}
	if d["Udp.NoPorts"] != 5 || d["TcpExt.TCPOFOQueue"] != 1000 || d["Tcp.CurrEstab"] != -2 || d["Udp.InDatagrams"] != 0 {
		t.Errorf("deltas %v", d)
	}
	if len(d) != len(DefaultCounters)+1 {
		t.Errorf("%d deltas for %d names", len(d), len(DefaultCounters)+1)
	}
	all, err := CounterDeltas(a, b, nil)
	if err != nil || len(all) != len(b) {
		t.Errorf("all counters: %d deltas, err %v", len(all), err)
	}
	if _, err := CounterDeltas(a, b, []string{"Udp.Nope"}); !errors.Is(err, ErrNoCounter) {
		t.Errorf("missing counter: err %v", err)
	}
	b["Udp.InDatagrams"] = 0 // a counter going back: namespace recreated
	if _, err := CounterDeltas(a, b, DefaultCounters); !errors.Is(err, ErrCounterReset) {
		t.Errorf("counter reset: err %v", err)
	}
}

var nsSeq atomic.Int32

// testNS creates a fresh namespace with loopback up and deletes it when the test ends.
func testNS(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	name := fmt.Sprintf("prg-tprobe-%d-%d", os.Getpid(), nsSeq.Add(1))
	if err := netnsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netnsutil.Delete(name); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	if _, err := netnsutil.Run(context.Background(), name, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	return name
}

// sendToClosedPort sends n UDP datagrams to a closed port on the namespace's loopback. Each one
// counts as Udp.NoPorts there. The socket is unconnected so the ICMP errors coming back do not
// fail later sends.
func sendToClosedPort(t *testing.T, ns string, n int) {
	t.Helper()
	var conn net.PacketConn
	err := netnsutil.Do(ns, func() error {
		var err error
		conn, err = net.ListenPacket("udp4", "127.0.0.1:0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9} // nothing listens in a fresh namespace
	for range n {
		if _, err := conn.WriteTo([]byte("peregrine"), dst); err != nil {
			t.Fatal(err)
		}
	}
}

// waitCounter polls a namespace's counter until it reaches want: loopback delivery may finish in
// a softirq shortly after the send returns.
func waitCounter(t *testing.T, ns, name string, want int64) Counters {
	t.Helper()
	var c Counters
	for deadline := time.Now().Add(2 * time.Second); ; {
		var err error
		if c, err = ReadNstat(ns); err != nil {
			t.Fatal(err)
		}
		if v, _ := c.Get(name); v >= want || time.Now().After(deadline) {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProcSelfNetIsNotPerThread pins down why nstat.go reads /proc/thread-self/net: netnsutil.Do
// moves only one thread into the namespace, and /proc/self/net (= /proc/net) shows the namespace
// of the thread-group leader. The two agree only when the switched thread is the leader (Go's
// main thread), so the test switches a thread it knows is not the leader.
func TestProcSelfNetIsNotPerThread(t *testing.T) {
	ns := testNS(t)
	devs := func(path string) ([]string, error) {
		b, err := os.ReadFile(path)
		var n []string
		for _, l := range strings.Split(string(b), "\n") {
			if name, _, ok := strings.Cut(l, ":"); ok && !strings.Contains(name, "|") {
				n = append(n, strings.TrimSpace(name))
			}
		}
		return n, err
	}
	rootDevs, err := devs("/proc/thread-self/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		leader       bool
		self, thread []string
		err          error
	}
	// A goroutine that lands on the leader keeps it occupied (locked, never switched) until the
	// test ends, so that the next attempt runs on another thread.
	release := make(chan struct{})
	defer close(release)
	for range 100 {
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				ch <- result{leader: true}
				<-release
				runtime.UnlockOSThread() // never switched: the leader goes back clean
				return
			}
			// Never unlocked: this thread dies with the goroutine instead of going back to the pool.
			f, err := os.Open(netnsutil.Path(ns))
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{err: err}
				return
			}
			var r result
			if r.self, r.err = devs("/proc/self/net/dev"); r.err == nil {
				r.thread, r.err = devs("/proc/thread-self/net/dev")
			}
			ch <- r
		}()
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.leader {
			continue
		}
		if len(r.thread) != 1 || r.thread[0] != "lo" {
			t.Errorf("/proc/thread-self/net/dev in a fresh namespace lists %v, want [lo]", r.thread)
		}
		if !slices.Equal(r.self, rootDevs) {
			t.Errorf("/proc/self/net/dev lists %v, want the leader's (root) namespace %v", r.self, rootDevs)
		}
		return
	}
	t.Skip("every goroutine landed on the leader thread")
}

func TestNstatPerNamespace(t *testing.T) {
	ns := testNS(t)
	root0, err := ReadNstat("")
	if err != nil {
		t.Fatal(err)
	}
	ns0, err := ReadNstat(ns)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh namespace starts from zero; the root namespace has seen traffic since boot.
	if v, _ := ns0.Get("Ip.InReceives"); v != 0 {
		t.Errorf("fresh namespace Ip.InReceives = %d, want 0", v)
	}
	if v, _ := root0.Get("Ip.InReceives"); v == 0 {
		t.Log("root namespace has received no IP packets; distinctness check is weaker")
	}

	const n = 37
	sendToClosedPort(t, ns, n)
	ns1 := waitCounter(t, ns, "Udp.NoPorts", n)
	root1, err := ReadNstat("")
	if err != nil {
		t.Fatal(err)
	}
	dn, err := CounterDeltas(ns0, ns1, DefaultCounters)
	if err != nil {
		t.Fatal(err)
	}
	dr, err := CounterDeltas(root0, root1, DefaultCounters)
	if err != nil {
		t.Fatal(err)
	}
	if dn["Udp.NoPorts"] != n {
		t.Errorf("namespace Udp.NoPorts rose by %d, want %d", dn["Udp.NoPorts"], n)
	}
	// Other processes may use the root namespace meanwhile, but not 37 closed-port datagrams.
	if dr["Udp.NoPorts"] >= n {
		t.Errorf("root Udp.NoPorts rose by %d: the namespace's traffic leaked into root counters", dr["Udp.NoPorts"])
	}
	if dn["Udp.InDatagrams"] != 0 {
		t.Errorf("namespace Udp.InDatagrams rose by %d, want 0 (nothing listens)", dn["Udp.InDatagrams"])
	}
}
