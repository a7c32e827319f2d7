// Package bpfequiv checks that a rewritten eBPF program decides exactly as the version it
// replaces: a test keeps the old compiled object (testdata/*_before.o), loads it beside the new
// one, gives both the same map contents and the same crafted packets through BPF_PROG_RUN, and
// compares what they did (return code, output frame, and whatever record the program keeps).
// Used by the cost cuts of issue 12: same decisions, fewer nanoseconds.
package bpfequiv

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Before is the old object, loaded.
type Before struct {
	Coll *ebpf.Collection
}

// LoadBefore loads the old object file. Maps are created fresh (nothing is pinned); prepare,
// when given, adjusts the spec first as the new code's loader does (map sizes, constants).
func LoadBefore(t testing.TB, path string, prepare ...func(*ebpf.CollectionSpec)) *Before {
	t.Helper()
	testutil.RequireRoot(t)
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for _, f := range prepare {
		f(spec)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	t.Cleanup(coll.Close)
	return &Before{Coll: coll}
}

// CopyMaps makes the old object's maps of these names hold exactly what the new maps hold
// (the settings a test wrote through the new code's own API). Entries are copied as bytes: the
// values' layouts must not have changed, which the copy checks by size.
func (b *Before) CopyMaps(t testing.TB, from map[string]*ebpf.Map) {
	t.Helper()
	for name, src := range from {
		dst := b.Coll.Maps[name]
		if dst == nil {
			t.Fatalf("old object has no map %s", name)
		}
		if dst.KeySize() != src.KeySize() || dst.ValueSize() != src.ValueSize() || dst.Type() != src.Type() {
			t.Fatalf("map %s changed layout (key %d/%d, value %d/%d): compare decisions another way",
				name, dst.KeySize(), src.KeySize(), dst.ValueSize(), src.ValueSize())
		}
		if err := copyMap(dst, src); err != nil {
			t.Fatalf("copy %s: %v", name, err)
		}
	}
}

func copyMap(dst, src *ebpf.Map) error {
	// Empty dst first (arrays cannot be emptied: every key is overwritten below anyway).
	if dst.Type() != ebpf.Array && dst.Type() != ebpf.PerCPUArray {
		var k []byte
		var keys [][]byte
		it := dst.Iterate()
		var v []byte
		for it.Next(&k, &v) {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			_ = dst.Delete(k)
		}
	}
	var k, v []byte
	it := src.Iterate()
	for it.Next(&k, &v) {
		if err := dst.Put(k, v); err != nil {
			return fmt.Errorf("put: %w", err)
		}
	}
	return it.Err()
}

// Result is what one run did.
type Result struct {
	Ret    uint32
	Out    []byte
	Record []byte // the per-CPU record the program wrote on the CPU it ran on, nil if none
}

// Run runs prog on frame and returns its verdict, the frame it left and, when rec names a
// per-CPU array (key 0) the program writes its last decision into, that record. Every CPU's
// slot is first filled with 0xff bytes so the written one can be found.
func Run(t *testing.T, prog *ebpf.Program, rec *ebpf.Map, frame []byte) Result {
	t.Helper()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	var mark [][]byte
	if rec != nil {
		for range ncpu {
			mark = append(mark, bytes.Repeat([]byte{0xff}, int(rec.ValueSize())))
		}
		if err := rec.Put(uint32(0), mark); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]byte, len(frame)+256)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	r := Result{Ret: ret, Out: out}
	if rec != nil {
		var per [][]byte
		if err := rec.Lookup(uint32(0), &per); err != nil {
			t.Fatal(err)
		}
		for i, v := range per {
			if !bytes.Equal(v, mark[i]) {
				r.Record = v
				break
			}
		}
	}
	return r
}

// Same fails the test when the two results differ.
func Same(t *testing.T, what string, before, after Result) {
	t.Helper()
	if before.Ret != after.Ret {
		t.Errorf("%s: verdict %#x before, %#x after", what, before.Ret, after.Ret)
	}
	if !bytes.Equal(before.Out, after.Out) {
		t.Errorf("%s: output frame differs", what)
	}
	if !bytes.Equal(before.Record, after.Record) {
		t.Errorf("%s: record before %x\n after %x", what, before.Record, after.Record)
	}
}

// Alternate times two programs on the same frame, alternating which runs first each round so
// neither gets the warmer cache, and reports both as ns per run (BPF_PROG_TEST_RUN's own
// timing over repeat runs).
func Alternate(b *testing.B, before, after *ebpf.Program, frame []byte, repeat int) {
	b.Helper()
	var tb, ta time.Duration
	for i := 0; i < b.N; i++ {
		order := []*ebpf.Program{before, after}
		if i%2 == 1 {
			order[0], order[1] = after, before
		}
		for _, p := range order {
			_, d, err := p.Benchmark(frame, repeat, nil)
			if err != nil {
				b.Fatal(err)
			}
			if p == before {
				tb += d
			} else {
				ta += d
			}
		}
	}
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), "before_ns/run")
	b.ReportMetric(float64(ta.Nanoseconds())/float64(b.N), "after_ns/run")
}
