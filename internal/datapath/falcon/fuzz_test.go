package falcon

import (
	"math/rand/v2"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Generated frames (random, truncated, malformed, VXLAN or not) through both programs, checked
// against the parser model: every frame goes on unchanged (tcx next), a frame the model can
// read is steered with the model's flow hash and salt, any other is left alone. The suite runs
// a slice; `make fuzz` runs a million.
func TestFuzzAgainstModel(t *testing.T) {
	h := newHarness(t, []int{0, 1}, true, true)
	ports := []uint16{4789, 8472}
	rng := rand.New(rand.NewPCG(1, 2))
	for i, n := 0, frames.FuzzCount(20000); i < n && !t.Failed(); i++ {
		frame := frames.Random(rng, ports)
		in, r := flow.ParseFrame(frame, 0, 0)
		h.check(h.run(h.o.PrgFalconPort, frame), r == flow.OK, in.Key.Hash(), testSalt, frame)
		off, vni, r := flow.VXLANOuter(frame, ports)
		if r == flow.OK {
			in, r = flow.ParseFrame(frame, off, 0)
		}
		h.check(h.run(h.o.PrgFalconNic, frame), r == flow.OK, in.Key.Hash(), Fmix32(testSalt^vni), frame)
	}
}

func (h *harness) check(got falFalconLast, steered bool, fh, salt uint32, frame []byte) {
	h.t.Helper()
	switch {
	case !steered && got.Kind != KindPass:
		h.t.Errorf("model leaves it alone, program decided %s: % x", KindName(got.Kind), frame)
	case steered && got.Kind == KindPass:
		h.t.Errorf("model steers it (hash %#x), program passed it: % x", fh, frame)
	case steered && (got.FlowHash != fh || got.Salt != salt):
		h.t.Errorf("flow hash %#x salt %#x, model %#x %#x: % x", got.FlowHash, got.Salt, fh, salt, frame)
	}
}
