package falcon

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/probe"
)

// RPSHash must land on its index for every set size the program accepts and every flow hash.
func TestRPSHashExactAllSizes(t *testing.T) {
	fhs := []uint32{0, 1, 2, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff, 0x9e3779b9}
	for n := uint32(1); n <= MaxCPUs; n++ {
		for idx := uint32(0); idx < n; idx++ {
			for _, fh := range fhs {
				h := RPSHash(idx, n, fh)
				if h == 0 {
					t.Fatalf("n=%d idx=%d fh=%#x: hash 0 means no hash to RPS", n, idx, fh)
				}
				if got := ReciprocalScale(h, n); got != idx {
					t.Fatalf("n=%d idx=%d fh=%#x: hash %#x maps to %d", n, idx, fh, h, got)
				}
			}
		}
	}
}

func TestChooseFollowsAlgorithm1(t *testing.T) {
	p := Params{CPUs: []int{0, 1, 2, 3}, Threshold: 80, TwoChoice: true, GateOpen: true, Load: map[int]uint32{}}
	fh, salt := uint32(12345), uint32(777)
	first := Choose(p, fh, salt)
	if first.Kind != KindFirst {
		t.Fatalf("idle CPUs: %s, want first", KindName(first.Kind))
	}
	p.Load[first.CPU] = 80 // at the threshold counts as busy
	second := Choose(p, fh, salt)
	if second.Kind != KindSecond || second.Idx != Fmix32(Fmix32(fh+salt))%4 {
		t.Fatalf("busy first choice: %+v", second)
	}
	p.Load[second.CPU] = 100 // kept regardless
	if again := Choose(p, fh, salt); again != second {
		t.Fatalf("second choice not kept when busy: %+v vs %+v", again, second)
	}
	p.TwoChoice = false
	if s := Choose(p, fh, salt); s.Kind != KindFirst || s.Idx != first.Idx {
		t.Fatalf("static: %+v, want the first choice", s)
	}
	p.GateOpen = false
	if g := Choose(p, fh, salt); g.Kind != KindGate || g.Hash != 0 {
		t.Fatalf("gate closed: %+v", g)
	}
}

// Stages of one flow get independent CPUs: over many flows, the two stages disagree about as
// often as independent picks would (1 - 1/n).
func TestSaltsSeparateStages(t *testing.T) {
	p := Params{CPUs: []int{0, 1}, Threshold: 80, GateOpen: true}
	a, b := DeviceSalt(4026531840, 5), DeviceSalt(4026532000, 5) // same ifindex, other namespace
	if a == b {
		t.Fatal("same ifindex in two namespaces gave one salt")
	}
	differ := 0
	for i := 0; i < 1000; i++ {
		fh := testFlow(i).Hash()
		if Choose(p, fh, a).CPU != Choose(p, fh, b).CPU {
			differ++
		}
	}
	if differ < 400 || differ > 600 {
		t.Errorf("stages disagree for %d of 1000 flows on 2 CPUs, want about 500", differ)
	}
}

func TestParseConfigRejectsBadInput(t *testing.T) {
	for _, extra := range []map[string]string{
		{OptThreshold: "101"}, {OptThreshold: "-1"}, {OptThreshold: "x"},
		{OptInterval: "0s"}, {OptInterval: "fast"}, {OptStatic: "maybe"}, {OptSplit: "sometimes"}, {OptLoad: "idle"},
	} {
		if _, err := ParseConfig(nil, extra); err == nil {
			t.Errorf("%v accepted", extra)
		}
	}
	if _, err := ParseConfig([]int{MaxCPUID - 1}, nil); err == nil {
		t.Error("absent CPU accepted")
	}
	c, err := ParseConfig([]int{1, 0, 1}, map[string]string{OptThreshold: "85", OptStatic: "true", OptInterval: "30ms"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.CPUs) != 2 || c.CPUs[0] != 0 || c.Threshold != 85 || c.TwoChoice || c.Interval.Milliseconds() != 30 || c.Load != probe.LoadKernel {
		t.Errorf("parsed %+v", c)
	}
	if c, err := ParseConfig(nil, map[string]string{OptLoad: "busy"}); err != nil || c.loadSignal() != probe.LoadBusy {
		t.Errorf("load=busy: %+v, %v", c, err)
	}
	if (Config{}).loadSignal() != probe.LoadBusy {
		t.Error("a record from before the load option must keep the prototype's busy signal")
	}
}
