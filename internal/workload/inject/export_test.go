package inject

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// LoadProgramForTest loads prg_inject_xdp configured for c and returns it with its counters.
func LoadProgramForTest(t *testing.T, c Config) (*ebpf.Program, *ebpf.Map, func()) {
	t.Helper()
	testutil.RequireRoot(t)
	spec, err := loadInj()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[injVarPrgInjectOff].Set(uint32(c.Headroom())); err != nil {
		t.Fatal(err)
	}
	var objs injObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	return objs.PrgInjectXdp, objs.PrgInjectSeq, func() { objs.Close() }
}
