package inject

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Fuzzing prg_inject_xdp against a Go model: for both payload offsets (plain UDP, VXLAN), frames
// of every length around the payload, flow ids in and out of the counter table, random bytes.
// A frame too short for the 16 payload bytes the program reads, or with a flow id past the
// table, is aborted unchanged; any other is transmitted with exactly its bytes off..off+8
// replaced by the flow's next sequence number (big endian), and that flow's counter (on the
// pinned CPU) advances by one.
func TestFuzzInjectXDP(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	const maxFlows = 1024 // PRG_INJECT_MAX_FLOWS
	for _, c := range []Config{{Plain: true}, {}} {
		off := c.Headroom()
		prog, seqs, done := LoadProgramForTest(t, c)
		ncpu, err := ebpf.PossibleCPU()
		if err != nil {
			t.Fatal(err)
		}
		model := map[uint32]uint64{}
		// Start a few flows at numbers past 32 bits, so byte order shows in every byte.
		for _, f := range []uint32{0, 3, maxFlows - 1} {
			per := make([]uint64, ncpu)
			per[0] = uint64(f+1) << 40
			if err := seqs.Put(f, per); err != nil {
				t.Fatal(err)
			}
			model[f] = per[0]
		}
		rng := rand.New(rand.NewPCG(101, 102))
		runs, tx := 0, 0
		check := func(b []byte) {
			if t.Failed() {
				return
			}
			runs++
			in := append([]byte{}, b...)
			opts := &ebpf.RunOptions{Data: b, DataOut: make([]byte, len(b)+64)}
			ret, err := prog.Run(opts)
			if err != nil {
				t.Fatalf("test run: %v", err)
			}
			want, wret := in, uint32(0) // XDP_ABORTED
			if len(in) >= off+16 {
				if flow := binary.BigEndian.Uint32(in[off+8:]); flow < maxFlows {
					want, wret = append([]byte{}, in...), 3 // XDP_TX
					binary.BigEndian.PutUint64(want[off:], model[flow])
					model[flow]++
					tx++
					var per []uint64
					if err := seqs.Lookup(flow, &per); err != nil {
						t.Fatal(err)
					}
					if per[0] != model[flow] {
						t.Errorf("offset %d: flow %d counter %d after the frame, model %d", off, flow, per[0], model[flow])
					}
				}
			}
			if ret != wret || !bytes.Equal(opts.DataOut, want) {
				t.Errorf("offset %d: action %d, model %d; frame as the model %v\n in % x\nout % x\nwant % x", off, ret, wret, bytes.Equal(opts.DataOut, want), in, opts.DataOut, want)
			}
		}
		for i, n := 0, frames.FuzzCount(20000)/2; i < n && !t.Failed(); i++ {
			var f []byte
			switch rng.IntN(4) {
			case 0:
				f = frames.Random(rng, []uint16{4789})
			default:
				f = make([]byte, off+16+rng.IntN(64))
				for j := range f {
					f[j] = byte(rng.Uint32())
				}
				flows := []uint32{0, 3, 5, maxFlows - 1, maxFlows, 1 << 31, rng.Uint32()}
				binary.BigEndian.PutUint32(f[off+8:], flows[rng.IntN(len(flows))])
			}
			if i%512 == 0 { // every length from the Ethernet header up
				for n := 14; n <= len(f); n++ {
					check(f[:n:n])
				}
				continue
			}
			check(f)
		}
		done()
		t.Logf("payload at %d: %d frames, %d transmitted", off, runs, tx)
		if tx == 0 || tx == runs {
			t.Fatalf("offset %d: %d of %d frames transmitted: the generator misses a path", off, tx, runs)
		}
	}
}
