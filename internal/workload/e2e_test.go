package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// End-to-end tests: two namespaces joined by a veth pair, every tool run across it for
// 1–2 s. They need root and the tools; they are skipped, not failed, without them.

const (
	nsA   = "prg-twl-a" // servers
	nsB   = "prg-twl-b" // clients
	addrA = "198.18.251.1"
	addrB = "198.18.251.2"
)

// setupPair creates nsA and nsB with a veth between them and removes them in Cleanup. It
// first removes leftovers of a crashed earlier run.
func setupPair(t *testing.T, tools ...string) {
	t.Helper()
	testutil.RequireRoot(t)
	if err := Require(tools...); err != nil {
		t.Fatal(err) // scripts/setup.sh installs every workload tool
	}
	for _, ns := range []string{nsA, nsB} {
		netnsutil.Delete(ns)
	}
	if l, err := netlink.LinkByName("prg-twl-va"); err == nil {
		netlink.LinkDel(l)
	}
	t.Cleanup(func() {
		for _, ns := range []string{nsA, nsB} {
			if ino, err := netnsutil.Inode(netnsutil.Path(ns)); err == nil {
				for _, pid := range netnsutil.PIDsIn(ino) {
					t.Errorf("process %d (%s) still alive in %s at cleanup", pid, comm(pid), ns)
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if err := netnsutil.Delete(ns); err != nil {
				t.Errorf("delete %s: %v", ns, err)
			}
		}
	})
	for _, ns := range []string{nsA, nsB} {
		if err := netnsutil.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "prg-twl-va"}, PeerName: "prg-twl-vb"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, end := range []struct{ dev, ns, addr string }{{"prg-twl-va", nsA, addrA}, {"prg-twl-vb", nsB, addrB}} {
		link, err := netlink.LinkByName(end.dev)
		if err != nil {
			t.Fatal(err)
		}
		h, err := netnsutil.Handle(end.ns)
		if err != nil {
			t.Fatal(err)
		}
		err = netlink.LinkSetNsFd(link, int(h))
		if err != nil {
			err = fmt.Errorf("move: %w", err)
		} else {
			err = configureIn(h, end.dev, end.addr)
		}
		h.Close()
		if err != nil {
			t.Fatalf("%s in %s: %v", end.dev, end.ns, err)
		}
	}
}

// configureIn brings lo and dev up inside the namespace and gives dev its /24 address.
func configureIn(ns netns.NsHandle, dev, addr string) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	link, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s: %w", dev, err)
	}
	a, err := netlink.ParseAddr(addr + "/24")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(link, a); err != nil {
		return err
	}
	return h.LinkSetUp(link)
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// assertNoProcs fails if any process is left in the namespaces. Killed nginx workers are
// reparented and reaped asynchronously, so allow a moment for them to disappear.
func assertNoProcs(t *testing.T, names ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		var left []string
		for _, ns := range names {
			ino, err := netnsutil.Inode(netnsutil.Path(ns))
			if err != nil {
				t.Fatal(err)
			}
			for _, pid := range netnsutil.PIDsIn(ino) {
				left = append(left, ns+":"+strconv.Itoa(pid)+"("+comm(pid)+")")
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left behind: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func logJSON(t *testing.T, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", b)
}

func percentilesSane(t *testing.T, what string, ps ...float64) {
	t.Helper()
	for i, p := range ps {
		if p <= 0 || (i > 0 && p < ps[i-1]) {
			t.Errorf("%s: percentiles not positive and ascending: %v", what, ps)
			return
		}
	}
}

func TestIperf3TCPAcrossNamespaces(t *testing.T) {
	setupPair(t, "iperf3")
	r, err := Iperf3Config{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: 2 * time.Second,
		Streams: 2, Length: 16384}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	logJSON(t, r)
	if r.ReceivedBps <= 0 || r.SentBytes == 0 || len(r.PerStream) != 2 || r.Length != 16384 {
		t.Errorf("implausible: %+v", r)
	}
	assertNoProcs(t, nsA, nsB)
}

func TestIperf3UDPAcrossNamespaces(t *testing.T) {
	setupPair(t, "iperf3", "taskset")
	r, err := Iperf3Config{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: time.Second,
		UDP: true, Length: 64, ServerCPUs: "0", ClientCPUs: "1"}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	logJSON(t, r)
	u := r.UDP
	if u == nil || u.PacketsDelivered <= 0 || u.DeliveredPPS <= 0 || u.PacketsSent < u.PacketsDelivered || r.ReceivedBps <= 0 {
		t.Errorf("implausible: %+v %+v", r, u)
	}
	assertNoProcs(t, nsA, nsB)
}

func TestSockperfAcrossNamespaces(t *testing.T) {
	setupPair(t, "sockperf")
	for _, c := range []SockperfConfig{
		{Mode: SockperfPingPong, MsgSize: 64},
		{Mode: SockperfUnderLoad, TCP: true, MsgSize: 256, MPS: 20000, ReplyEvery: 10},
	} {
		c.ServerNS, c.ServerAddr, c.ClientNS, c.Duration = nsA, addrA, nsB, time.Second
		r, err := c.Run(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", c.Mode, err)
		}
		logJSON(t, r)
		if r.Observations <= 0 || r.AvgUs <= 0 {
			t.Errorf("%s: no observations: %+v", c.Mode, r)
		}
		percentilesSane(t, c.Mode, r.MinUs, r.P50Us, r.P90Us, r.P99Us, r.P999Us, r.MaxUs)
	}
	assertNoProcs(t, nsA, nsB)
}

func TestMemcachedAcrossNamespaces(t *testing.T) {
	setupPair(t, "memcached")
	r, err := MemcachedConfig{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: time.Second,
		Connections: 4, Keys: 1000, ValueSize: 100, ClientCPUs: "1"}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	logJSON(t, r)
	if r.OpsPerSec <= 0 || r.Gets == 0 || r.Sets == 0 || r.GetMisses != 0 {
		t.Errorf("implausible: %+v", r)
	}
	percentilesSane(t, "memcached", r.MinUs, r.P50Us, r.P90Us, r.P99Us, r.P999Us, r.MaxUs)
	assertNoProcs(t, nsA, nsB)
}

func TestNginxAcrossNamespaces(t *testing.T) {
	setupPair(t, "nginx", "wrk")
	r, err := NginxConfig{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: time.Second,
		FileSize: 4096, Workers: 2, Threads: 2, Connections: 8}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	logJSON(t, r)
	if r.RequestsPerSec <= 0 || r.TransferBytesPerSec < r.RequestsPerSec*4096 || r.Non2xx3xx != 0 {
		t.Errorf("implausible: %+v", r)
	}
	percentilesSane(t, "wrk", r.P50Us, r.P75Us, r.P90Us, r.P99Us, r.LatencyMaxUs)
	assertNoProcs(t, nsA, nsB)
}

// killServerAfter kills every process in the server namespace after d, like a crash.
func killServerAfter(t *testing.T, d time.Duration) {
	go func() {
		time.Sleep(d)
		ino, err := netnsutil.Inode(netnsutil.Path(nsA))
		if err != nil {
			return
		}
		for _, pid := range netnsutil.PIDsIn(ino) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
}

func TestFailuresLeaveNothingBehind(t *testing.T) {
	setupPair(t, "iperf3", "sockperf", "memcached")

	t.Run("iperf3 server killed midway", func(t *testing.T) {
		killServerAfter(t, 700*time.Millisecond)
		start := time.Now()
		_, err := Iperf3Config{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: 5 * time.Second}.Run(context.Background())
		t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if err == nil || !strings.Contains(err.Error(), "iperf3") || !strings.Contains(err.Error(), nsB) {
			t.Errorf("want an iperf3 error naming %s, got %v", nsB, err)
		}
		assertNoProcs(t, nsA, nsB)
	})

	t.Run("server cannot start", func(t *testing.T) {
		// An address the server namespace does not own: the bind fails.
		_, err := Iperf3Config{ServerNS: nsA, ServerAddr: "198.18.251.99", ClientNS: nsB, Duration: time.Second}.Run(context.Background())
		t.Logf("%v", err)
		if err == nil || !strings.Contains(err.Error(), "iperf3 server ("+nsA+")") || !strings.Contains(err.Error(), "last stdout") && !strings.Contains(err.Error(), "last stderr") {
			t.Errorf("want an iperf3 server error with its output, got %v", err)
		}
		assertNoProcs(t, nsA, nsB)
	})

	t.Run("sockperf cancelled", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := SockperfConfig{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: 10 * time.Second}.Run(ctx)
		took := time.Since(start)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		if err == nil || !strings.Contains(err.Error(), "sockperf") || !strings.Contains(err.Error(), "cancelled") {
			t.Errorf("want a cancellation error, got %v", err)
		}
		if took > 3*time.Second {
			t.Errorf("cancel took %v", took)
		}
		assertNoProcs(t, nsA, nsB)
	})

	t.Run("memcached killed midway", func(t *testing.T) {
		killServerAfter(t, 700*time.Millisecond)
		_, err := MemcachedConfig{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: 3 * time.Second, Connections: 2}.Run(context.Background())
		t.Logf("%v", err)
		if err == nil || !strings.Contains(err.Error(), "memcached") {
			t.Errorf("want a memcached error, got %v", err)
		}
		assertNoProcs(t, nsA, nsB)
	})

	t.Run("memcached cancelled", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
		defer cancel()
		procsBefore := runtime.GOMAXPROCS(0)
		start := time.Now()
		_, err := MemcachedConfig{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Duration: 10 * time.Second, Connections: 3}.Run(ctx)
		took := time.Since(start)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		if err == nil || !strings.Contains(err.Error(), "cancelled") || took > 3*time.Second {
			t.Errorf("want a prompt cancellation error, got %v after %v", err, took)
		}
		if got := runtime.GOMAXPROCS(0); got != procsBefore {
			t.Errorf("GOMAXPROCS left at %d, was %d", got, procsBefore)
		}
		assertNoProcs(t, nsA, nsB)
	})

	t.Run("missing namespace", func(t *testing.T) {
		_, err := SockperfConfig{ServerNS: "prg-twl-none", ServerAddr: addrA, ClientNS: nsB, Duration: time.Second}.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "prg-twl-none") {
			t.Errorf("got %v", err)
		}
	})
}
