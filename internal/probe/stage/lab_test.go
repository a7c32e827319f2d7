package stage

import (
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Names and addresses of the test topology: two namespaces joined by one veth pair, in the
// RFC 2544 benchmarking range so nothing here can collide with a real network.
const (
	nsA   = "prg-tstage-a"
	nsB   = "prg-tstage-b"
	vethA = "prg-ts-a"
	vethB = "prg-ts-b"
	addrA = "198.18.250.1"
	addrB = "198.18.250.2"
)

// pair is the built topology: what the assertions need to find b's veth in the probe's keys.
type pair struct {
	inoA, inoB uint64
	devA, devB DevKey
}

// needRoot fails tests that create namespaces or load BPF when they cannot (never a skip).
func needRoot(t *testing.T) {
	t.Helper()
	testutil.RequireCheck(t, "stage probe", Check)
}

// buildPair creates a <-veth-> b and registers its teardown, which also runs when the test fails.
func buildPair(t *testing.T) pair {
	t.Helper()
	for _, ns := range []string{nsA, nsB} {
		_ = netnsutil.Delete(ns) // a crashed earlier run may have left it behind
		if err := netnsutil.Create(ns); err != nil {
			t.Fatalf("create netns: %v", err)
		}
		t.Cleanup(func() {
			if err := netnsutil.Delete(ns); err != nil {
				t.Errorf("delete netns %s: %v", ns, err)
			}
		})
	}

	var p pair
	var err error
	if p.inoA, err = netnsutil.Inode(netnsutil.Path(nsA)); err != nil {
		t.Fatal(err)
	}
	if p.inoB, err = netnsutil.Inode(netnsutil.Path(nsB)); err != nil {
		t.Fatal(err)
	}

	hb, err := netnsutil.Handle(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	// Create the pair inside a with its peer placed straight into b: nothing touches the host namespace.
	err = netnsutil.Do(nsA, func() error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: vethA},
			PeerName:      vethB,
			PeerNamespace: netlink.NsFd(int(hb)),
		}
		return netlink.LinkAdd(veth)
	})
	if err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	p.devA = DevKey{Netns: p.inoA, Ifindex: setUp(t, nsA, vethA, addrA)}
	p.devB = DevKey{Netns: p.inoB, Ifindex: setUp(t, nsB, vethB, addrB)}
	return p
}

// setUp addresses and raises a device (and lo) inside a namespace and returns the device's ifindex.
func setUp(t *testing.T, ns, dev, addr string) uint32 {
	t.Helper()
	var ifindex uint32
	err := netnsutil.Do(ns, func() error {
		for _, name := range []string{"lo", dev} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if name == dev {
				a, err := netlink.ParseAddr(addr + "/24")
				if err != nil {
					return err
				}
				if err := netlink.AddrAdd(l, a); err != nil {
					return fmt.Errorf("address %s on %s: %w", addr, dev, err)
				}
				ifindex = uint32(l.Attrs().Index)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("set %s up: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up %s in %s: %v", dev, ns, err)
	}
	return ifindex
}

// udpPair opens a receiver in b and a sender in a that is connected to it.
func udpPair(t *testing.T) (send, recv net.Conn) {
	t.Helper()
	err := netnsutil.Do(nsB, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(addrB), Port: 0})
		recv = c
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", nsB, err)
	}
	t.Cleanup(func() { recv.Close() })
	err = netnsutil.Do(nsA, func() error {
		c, err := net.DialUDP("udp4", nil, recv.LocalAddr().(*net.UDPAddr))
		send = c
		return err
	})
	if err != nil {
		t.Fatalf("dial from %s: %v", nsA, err)
	}
	t.Cleanup(func() { send.Close() })
	return send, recv
}
