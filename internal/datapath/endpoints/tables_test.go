package endpoints

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

var (
	macA = net.HardwareAddr{2, 0, 0, 0, 0, 0xa}
	macB = net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
)

func ep(addr, veth string, ifindex int, mac net.HardwareAddr) Endpoint {
	return Endpoint{Domain: 7, Addr: netip.MustParseAddr(addr), Veth: veth, Ifindex: ifindex, CtrMAC: mac}
}

// A pod's own word cannot tell the rightful owner of an address two pods claim: both claims go.
func TestDedup(t *testing.T) {
	a := ep("10.244.1.2", "vethA", 11, macA)
	a6 := ep("fd00::2", "vethA", 11, macA)
	b := ep("10.244.1.3", "vethB", 12, macB)
	hijack := ep("10.244.1.2", "vethB", 12, macB)
	otherDomain := hijack
	otherDomain.Domain = 8 // another overlay (tenant) may reuse the address
	keep, conf := Dedup([]Endpoint{a, a6, b, hijack, otherDomain, a})
	if len(conf) != 1 || conf[0].Addr != "10.244.1.2" || len(conf[0].Veths) != 2 || conf[0].Domain != 7 {
		t.Fatalf("conflicts %+v", conf)
	}
	want := map[string]bool{"fd00::2/vethA": true, "10.244.1.3/vethB": true, "10.244.1.2/vethB": true}
	if len(keep) != len(want) {
		t.Fatalf("kept %v", keep)
	}
	for _, e := range keep {
		if !want[e.Addr.String()+"/"+e.Veth] {
			t.Errorf("kept %s on %s", e.Addr, e.Veth)
		}
	}
	if s := conf[0].String(); s == "" {
		t.Error("no text")
	}
}

// Sync: an address another pod starts claiming loses its entry (not a tombstone, which would
// drop the rightful pod's frames), and gets it back once the claim is withdrawn.
func TestSyncRefusesDuplicates(t *testing.T) {
	testutil.RequireBPF(t)
	name := fmt.Sprintf("prg-ept%d", os.Getpid())
	testutil.TempNetns(t, name)
	var idx []int
	if err := netnsutil.Do(name, func() error {
		// Two veth ends stand for two pods' bridge-side veths (a devmap slot needs a device).
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "prg-a"}, PeerName: "prg-b"}); err != nil {
			return err
		}
		for _, n := range []string{"prg-a", "prg-b"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			idx = append(idx, l.Attrs().Index)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	epm, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 24, ValueSize: 32, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer epm.Close()
	port, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.DevMapHash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	tb := Tables{EP: epm, Port: port}
	a := ep("10.244.1.2", "prg-a", idx[0], macA)
	b := ep("10.244.1.3", "prg-b", idx[1], macB)
	hijack := ep("10.244.1.2", "prg-b", idx[1], macB)
	for _, e := range []*Endpoint{&a, &b, &hijack} {
		e.Netns = name
	}
	now := time.Now()
	if _, err := Sync(tb, []Endpoint{a, b}, now); err != nil {
		t.Fatal(err)
	}
	rep, err := Sync(tb, []Endpoint{a, b, hijack}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Conflicts) != 1 || len(rep.Changed) != 1 || rep.Changed[0] != a.Key() {
		t.Fatalf("report %+v", rep)
	}
	var v Entry
	if err := epm.Lookup(a.Key(), &v); err == nil {
		t.Fatalf("a refused address keeps an entry: %+v", v)
	}
	if err := epm.Lookup(b.Key(), &v); err != nil || v.Ifindex != uint32(idx[1]) {
		t.Fatalf("the hijacker's own address: %+v %v", v, err)
	}
	views, err := List(tb)
	if err != nil || len(views) != 1 {
		t.Fatalf("list %+v %v", views, err)
	}
	// The claim withdrawn: the rightful pod's entry comes back, on its own veth.
	rep, err = Sync(tb, []Endpoint{a, b}, now)
	if err != nil || len(rep.Conflicts) != 0 || rep.Added != 1 {
		t.Fatalf("report %+v %v", rep, err)
	}
	if err := epm.Lookup(a.Key(), &v); err != nil || v.Ifindex != uint32(idx[0]) || !Holds(tb, v.Slot, v.Ifindex) {
		t.Fatalf("a's entry: %+v %v", v, err)
	}
}
