package fastpath

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

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
