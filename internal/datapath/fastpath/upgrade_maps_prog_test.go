package fastpath

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// TestUpgradeAddsLaterMaps: an attachment pinned by a binary without IPv6 Service NAT (no
// prg_fastpath_nat6, no prg_fastpath_ho6) gets both created and pinned by the upgrade, the
// side table sized as the attachment's IPv6 flow table, and this binary's programs then load
// over the attachment's maps (what Upgrade does next), its existing maps and flows kept.
func TestUpgradeAddsLaterMaps(t *testing.T) {
	o := testutil.LoadObjects(t, loadObjects)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("prg-test-upgrade-%d", os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := pinObjects(o, dir); err != nil {
		t.Fatal(err)
	}
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	if err := o.PrgFastpathFlow6.Put(k, fpFpFlow{Flags: fOut | fIn}); err != nil {
		t.Fatal(err)
	}
	for _, name := range laterMaps { // as an older binary left it
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	addedMaps(dir)
	var m fpMaps
	for name, mp := range mapsOf(&m) {
		var err error
		if *mp, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			t.Fatalf("after the upgrade's additions, %s: %v", name, err)
		}
	}
	defer m.Close()
	if got, want := m.PrgFastpathNat6.MaxEntries(), m.PrgFastpathFlow6.MaxEntries(); got != want {
		t.Fatalf("side table of %d entries, want the IPv6 table's %d", got, want)
	}
	var f fpFpFlow
	if err := m.PrgFastpathFlow6.Lookup(k, &f); err != nil {
		t.Fatalf("the attachment's IPv6 flow went: %v", err)
	}
	spec, err := loadFp()
	if err != nil {
		t.Fatal(err)
	}
	keepFlowSizes(spec, &m)
	repl := map[string]*ebpf.Map{}
	for name, mp := range mapsOf(&m) {
		repl[name] = *mp
	}
	var progs fpPrograms
	if err := spec.LoadAndAssign(&progs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		t.Fatalf("this binary's programs over the upgraded attachment's maps: %v", err)
	}
	progs.Close()

	addedMaps(dir) // nothing missing: nothing replaced
	var again fpFpFlow
	if err := m.PrgFastpathFlow6.Lookup(k, &again); err != nil {
		t.Fatal(err)
	}
}

// TestReadBeforeUpgrade: an attachment of an older binary (no laterMaps pinned) cannot be opened
// whole (openPinned: the agent's upgrade adds the maps first), but status and /metrics open it to
// read (openPinnedToRead): the later maps nil, its counters readable, the later reasons 0. Before,
// the new binary's status said "live state unavailable: open pinned prg_fastpath_vtep6 (is
// fastpath attached ...?)" for every attachment an older binary made until the agent restarted.
func TestReadBeforeUpgrade(t *testing.T) {
	o := testutil.LoadObjects(t, loadObjects)
	old := datapath.PinRoot
	datapath.PinRoot = filepath.Join("/sys/fs/bpf", fmt.Sprintf("prg-test-read-%d", os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(datapath.PinRoot); datapath.PinRoot = old })
	const target = "prg-test-older"
	dir := datapath.ModePinDir(target, Name)
	if err := pinObjects(o, dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range laterMaps { // as an older binary left it
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := openPinned(target, 0); err == nil {
		p.Close()
		t.Fatal("openPinned opened an attachment that lacks the later maps")
	}
	p, err := openPinnedToRead(target)
	if err != nil {
		t.Fatalf("open to read an attachment of an older binary: %v", err)
	}
	defer p.Close()
	if p.PrgFastpathStat2 != nil || p.PrgFastpathU6cfg != nil || p.PrgFastpathFlow == nil || p.PrgFastpathStat == nil {
		t.Fatalf("maps opened: stat2 %v u6cfg %v flow %v stat %v; want the later ones nil, the others open",
			p.PrgFastpathStat2, p.PrgFastpathU6cfg, p.PrgFastpathFlow, p.PrgFastpathStat)
	}
	out, in, err := p.counters(0)
	if err != nil {
		t.Fatalf("counters: %v", err)
	}
	if out["closed-ct"] != 0 || in["closed-ct"] != 0 {
		t.Fatalf("a later reason read %d/%d from a map the attachment lacks", out["closed-ct"], in["closed-ct"])
	}
	if _, _, err := p.flowCounts(); err != nil {
		t.Fatalf("flow counts: %v", err)
	}
}
