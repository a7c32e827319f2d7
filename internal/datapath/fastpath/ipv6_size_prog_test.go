package fastpath

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// TestIPv6FlowTableSized: the IPv6 flow table is sized from the node's memory as the IPv4 one
// (not the object's fixed 16 384), and a spec loaded later (an overlay's copy of the programs,
// an upgrade in place) takes both tables' sizes from the attached maps, so the programs load
// over them.
func TestIPv6FlowTableSized(t *testing.T) {
	mem, err := memTotal()
	if err != nil {
		t.Fatal(err)
	}
	want := flowTableSize(mem)
	o := testutil.LoadObjects(t, loadObjects)
	if got := o.PrgFastpathFlow6.MaxEntries(); got != want {
		t.Fatalf("IPv6 flow table holds %d entries, want %d (as the IPv4 one, from %d bytes of memory)", got, want, mem)
	}
	if got := o.PrgFastpathFlow.MaxEntries(); got != want {
		t.Fatalf("IPv4 flow table holds %d entries, want %d", got, want)
	}

	spec, err := loadFp()
	if err != nil {
		t.Fatal(err)
	}
	keepFlowSizes(spec, &o.fpMaps)
	for _, name := range flowTables {
		if got := spec.Maps[name].MaxEntries; got != want {
			t.Fatalf("spec's %s: %d entries after keepFlowSizes, want %d", name, got, want)
		}
	}
	progs, err := loadOverlayPrograms(&o.fpMaps, 1)
	if err != nil {
		t.Fatalf("an overlay's programs over the sized maps: %v", err)
	}
	progs.Close()
}
