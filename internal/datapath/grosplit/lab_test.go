package grosplit

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The integration topology: a <-veth-> b, each end named eth0 like a lab host's underlay, in the
// RFC 2544 benchmarking range so nothing here can collide with a real network.
const (
	nsA   = "prg-tgs-a"
	nsB   = "prg-tgs-b"
	addrA = "198.18.251.1"
	addrB = "198.18.251.2"
	port  = 47890
)

func buildPair(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	// Registered first, so it runs last: after the detach and the namespace removal below.
	t.Cleanup(func() { testutil.AssertClean(t, "prg-tgs") })
	for _, ns := range []string{nsA, nsB} {
		_ = netnsutil.Delete(ns) // a crashed earlier run may have left it
		if err := netnsutil.Create(ns); err != nil {
			t.Fatalf("create netns: %v", err)
		}
		t.Cleanup(func() {
			if err := netnsutil.Delete(ns); err != nil {
				t.Errorf("delete netns %s: %v", ns, err)
			}
		})
	}
	hb, err := netnsutil.Handle(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	// Made inside a with the peer placed straight into b: the host namespace is never touched.
	err = netnsutil.Do(nsA, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"},
			PeerName: "eth0", PeerNamespace: netlink.NsFd(int(hb))})
	})
	if err != nil {
		t.Fatalf("create veth: %v", err)
	}
	for ns, addr := range map[string]string{nsA: addrA, nsB: addrB} {
		err := netnsutil.Do(ns, func() error {
			for _, name := range []string{"lo", "eth0"} {
				l, err := netlink.LinkByName(name)
				if err != nil {
					return err
				}
				if name == "eth0" {
					a, _ := netlink.ParseAddr(addr + "/24")
					if err := netlink.AddrAdd(l, a); err != nil {
						return err
					}
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("configure %s: %v", ns, err)
		}
	}
	// GRO on b's underlay, as in the lab: the split must take GRO along to the split CPU.
	if out, err := netnsutil.Run(context.Background(), nsB, "ethtool", "-K", "eth0", "gro", "on"); err != nil {
		t.Fatalf("gro on: %v %s", err, out)
	}
}

// wireChecksums makes a's eth0 send complete checksums, as a wire would (see vethPeerChecksums).
func wireChecksums(t *testing.T) {
	t.Helper()
	if out, err := netnsutil.Run(context.Background(), nsA, "ethtool", "-K", "eth0", "tx", "off"); err != nil {
		t.Fatalf("tx off: %v %s", err, out)
	}
}

// blast sends n UDP datagrams a -> b and returns how many b's socket received.
func blast(t *testing.T, n int) int {
	t.Helper()
	rx := labtest.ListenUDP(t, nsB, &net.UDPAddr{IP: net.ParseIP(addrB), Port: port})
	defer rx.Close() // now: the next blast uses the port
	_ = rx.SetReadBuffer(8 << 20)
	tx, err := netnsutil.DialContext(context.Background(), nsA, &net.Dialer{}, "udp4", net.JoinHostPort(addrB, strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("dial from a: %v", err)
	}
	defer tx.Close()
	got := make(chan int)
	go func() {
		buf := make([]byte, 2048)
		c := 0
		for {
			_ = rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := rx.Read(buf); err != nil {
				got <- c
				return
			}
			c++
		}
	}()
	msg := make([]byte, 200)
	for i := 0; i < n; i++ {
		if _, err := tx.Write(msg); err != nil {
			t.Errorf("send %d: %v", i, err)
			break
		}
		if i%64 == 63 {
			time.Sleep(time.Millisecond) // stay well under the ring and socket limits
		}
	}
	return <-got
}

func xdpAttached(t *testing.T) bool {
	t.Helper()
	var on bool
	err := netnsutil.Do(nsB, func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil && l.Attrs().Xdp != nil {
			on = l.Attrs().Xdp.Attached
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return on
}

func TestAttachRedirectsAndDetaches(t *testing.T) {
	buildPair(t)
	wireChecksums(t)
	cfg := Config{Netns: nsB, Device: "eth0", CPUs: []int{1}}
	pinDir := DefaultPinDir(nsB, "eth0")
	pins, err := Attach(cfg)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { _ = Detach(Pins(pinDir)) }) // on failure; a no-op after the Detach below
	// Attach closed all its descriptors: only the pins keep the program on the device.
	if !xdpAttached(t) {
		t.Fatal("no XDP program on b's eth0 after Attach returned")
	}
	if len(pins) != len(Pins(pinDir)) || len(pins) < 5 {
		t.Errorf("attach returned pins %v, the pin dir holds %v", pins, Pins(pinDir))
	}
	if _, err := Attach(cfg); err == nil {
		t.Error("a second Attach on the same device succeeded")
	}

	const n = 2000
	got := blast(t, n)
	st, err := ReadStats(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	sum := st.Sum()
	t.Logf("received %d/%d; redirected %d (to CPU 1: %d), passed %d, missed %d, dropped %d",
		got, n, sum.Redirected, sum.ToCPU[1], sum.Passed, sum.Missed, sum.Dropped)
	if out, err := netnsutil.Run(context.Background(), nsB, "nstat", "-az", "UdpInCsumErrors", "UdpInDatagrams", "IpInReceives", "IpInHdrErrors", "UdpInErrors"); err == nil {
		t.Logf("b nstat:\n%s", out)
	}
	if got < n*95/100 {
		t.Errorf("only %d of %d datagrams arrived through the split", got, n)
	}
	if sum.ToCPU[1] < uint64(n*95/100) || len(sum.ToCPU) != 1 {
		t.Errorf("redirects by CPU %v, want about %d, all to CPU 1", sum.ToCPU, n)
	}
	if sum.Passed == 0 {
		t.Error("ARP should have passed (non-IP), passed counter is 0")
	}

	// A live CPU-set change: new traffic goes to CPU 0 only.
	if err := SetCPUs(pinDir, []int{0}, 0); err != nil {
		t.Fatalf("set CPUs: %v", err)
	}
	got = blast(t, 500)
	st2, _ := ReadStats(pinDir)
	// A frame or two of the namespace's own (IPv6 router solicitations come seconds after the
	// link is up: the first blast also counted 2 001 redirects for 2 000 datagrams) may still
	// reach CPU 1 between the read above and the change: a few, not the blast.
	if d := st2.Sum().ToCPU[0]; d < 475 || got < 475 || st2.Sum().ToCPU[1] > sum.ToCPU[1]+5 {
		t.Errorf("after moving to CPU 0: received %d, redirects %v (before %v)", got, st2.Sum().ToCPU, sum.ToCPU)
	}

	if err := Detach(pins); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if xdpAttached(t) {
		t.Error("XDP program still on b's eth0 after Detach")
	}
	if left := Pins(pinDir); len(left) > 0 {
		t.Errorf("pins left: %v", left)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Errorf("pin dir %s still there (%v)", pinDir, err)
	}
	if _, err := os.Stat(filepath.Dir(pinDir)); !os.IsNotExist(err) {
		t.Errorf("namespace pin dir %s still there (%v)", filepath.Dir(pinDir), err)
	}
	if got := blast(t, 200); got < 190 {
		t.Errorf("after detach only %d of 200 arrived", got)
	}
}

func TestCheck(t *testing.T) {
	buildPair(t)
	// A veth peer with checksum offload on would have every redirected packet dropped.
	err := Check(nsB, "eth0")
	if err == nil || !strings.Contains(err.Error(), "tx checksum offload on") || !strings.Contains(err.Error(), "ethtool -K eth0 tx off") {
		t.Errorf("Check with the peer's tx checksum offload on = %v, want a refusal naming the fix", err)
	}
	wireChecksums(t)
	if err := Check(nsB, "eth0"); err != nil {
		t.Errorf("veth should run native XDP: %v", err)
	}
	// The loopback driver has no ndo_bpf: no native XDP.
	err = Check(nsB, "lo")
	if err == nil || !strings.Contains(err.Error(), "device lo has no native XDP support") {
		t.Errorf("Check(lo) = %v, want a 'no native XDP support' error", err)
	}
	if err := Check(nsB, "nosuchdev"); err == nil {
		t.Error("Check of a missing device passed")
	}
	if xdpAttached(t) {
		t.Error("Check left its trial program on eth0")
	}
}
