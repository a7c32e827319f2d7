package fastpath

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// The fuzz tests of the flannel layout: prg_fastpath_tx, prg_fastpath_rx and their learners.

func TestFuzzTx(t *testing.T) {
	e := newFzEnv(t, false)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), g.tx, func(b []byte) {
		var gso uint32
		if e.rng.IntN(8) == 0 {
			gso = uint32(64 + e.rng.IntN(1500))
		}
		in := append([]byte{}, b...)
		hit, want := e.modelTx(in, gso)
		var before Direction
		if hit && gso > 0 {
			before, _ = e.counters(t)
		}
		ret, out, _ := e.fzRun(e.o.PrgFastpathTx, b, gso, 0)
		if hit && gso > 0 {
			// A test run cannot set the skb's gso_type, and bpf_skb_adjust_room refuses to grow
			// a GSO skb of no type: the program counts an error and leaves the frame alone.
			// (The MTU check that reads gso_size ran before it: a frame too big per segment is
			// a normal-path frame of the model.)
			after, _ := e.counters(t)
			if ret != tcxNext || !bytes.Equal(out, in) || after["error"] != before["error"]+1 {
				t.Errorf("GSO frame past the MTU check: verdict %d, changed %v, errors %d -> %d", int32(ret), !bytes.Equal(out, in), before["error"], after["error"])
			}
			return
		}
		if !hit {
			if ret != tcxNext || !bytes.Equal(out, in) {
				p, _ := fzParse(in, 0)
				t.Errorf("model: normal path; program: verdict %d, changed %v (gso %d); flow %+v stale %v\n in % x\nout % x", int32(ret), !bytes.Equal(out, in), gso,
					e.flows[p.keyOut()], e.stale[p.keyOut()], in, out)
			}
			return
		}
		hits++
		if ret != tcActRedirect {
			t.Errorf("model: encapsulated; program: verdict %d (gso %d): % x", int32(ret), gso, in)
			return
		}
		if err := sameEncap(out, want); err != nil {
			t.Errorf("%v (gso %d)\n in % x\nout % x\nwant % x", err, gso, in, out, want)
		}
	})
	fzCovered(t, runs, hits, "encapsulated")
}

func TestFuzzRx(t *testing.T) {
	e := newFzEnv(t, false)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), func() []byte { return g.encap(vtepB, vtepA, true) }, func(b []byte) {
		in := append([]byte{}, b...)
		ret, out, _ := e.fzRun(e.o.PrgFastpathRx, b, 0, 0)
		hit, want := e.modelRx(in)
		switch {
		case !hit && (ret != tcxNext || !bytes.Equal(out, in)):
			t.Errorf("model: normal path; program: verdict %d, changed %v\n in % x\nout % x", int32(ret), !bytes.Equal(out, in), in, out)
		case hit && ret != tcActRedirect:
			t.Errorf("model: to the pod; program: verdict %d: % x", int32(ret), in)
		case hit && !bytes.Equal(out, want):
			t.Errorf("delivered frame differs from the model\n in % x\nout % x\nwant % x", in, out, want)
		}
		if hit {
			hits++
		}
	})
	fzCovered(t, runs, hits, "delivered")
}

// fzLearnCheck runs a learner over the generated frames: verdict TCX_NEXT, frame unchanged,
// the flow the model names learned with the model's values, every other flow untouched.
func fzLearnCheck(t *testing.T, e *fzEnv, p *ebpf.Program, marks bool, gen func() []byte, model func([]byte) (fpFpKey, fpFpFlow, bool)) {
	learnt := 0
	var k fpFpKey
	runs := e.fzEach(frames.FuzzCount(20000), gen, func(b []byte) {
		var mark uint32
		if marks && e.rng.IntN(20) == 0 {
			mark = markFast // a frame the fast path sent: the learner skips it and clears the mark
		}
		in := append([]byte{}, b...)
		ret, out, m := e.fzRun(p, b, 0, mark)
		if ret != tcxNext || !bytes.Equal(out, in) || m != 0 {
			t.Errorf("learner: verdict %d, changed %v, mark %#x after: % x", int32(ret), !bytes.Equal(out, in), m, in)
		}
		wk, want, learn := model(in)
		if mark != 0 {
			learn = false
		}
		if learn {
			learnt++
			var got fpFpFlow
			if err := e.o.PrgFastpathFlow.Lookup(wk, &got); err != nil {
				t.Fatal(err)
			}
			if got.OutNs == 0 && got.InNs == 0 {
				t.Errorf("learned without a timestamp: %+v", got)
			}
			want.OutNs, want.InNs = got.OutNs, got.InNs
			if got != want {
				t.Errorf("learned %+v\nmodel   %+v\nfrom % x", got, want, in)
			}
			if err := e.o.PrgFastpathFlow.Put(wk, e.flows[wk]); err != nil { // as installed
				t.Fatal(err)
			}
		}
		if e.rng.IntN(64) == 0 || !learn { // nothing else learned
			keys := e.keys
			if !learn {
				keys = []fpFpKey{e.keys[e.rng.IntN(len(e.keys))]}
				if _, ok := e.flows[wk]; ok {
					keys = append(keys, wk)
				}
			}
			for _, k = range keys {
				var got fpFpFlow
				if err := e.o.PrgFastpathFlow.Lookup(k, &got); err != nil {
					t.Fatal(err)
				}
				want := e.flows[k]
				want.OutNs, want.InNs = got.OutNs, got.InNs
				if got != want {
					t.Errorf("flow %+v changed by a frame the model does not learn from\n got %+v\nwant %+v\nframe % x", k, got, want, in)
				}
			}
		}
	})
	fzCovered(t, runs, learnt, "learned from")
}

func TestFuzzLearnTx(t *testing.T) {
	e := newFzEnv(t, true)
	g := fzGen{e.rng}
	fzLearnCheck(t, e, e.o.PrgFastpathLrnTx, true, func() []byte { return g.encap(vtepA, vtepB, false) }, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		vx, saddr, daddr := fzOuter(b)
		if !vx || saddr != word(vtepA) {
			return fpFpKey{}, fpFpFlow{}, false
		}
		p, k, f, ok := e.learnable(b, 50, true)
		if !ok {
			return k, f, false
		}
		copy(f.Tmpl[:], b[:64])
		f.Vtep, f.OutTtlDec, f.OutTtlSeen, f.Flags = daddr, f.OutTtlSeen-p.ttl, 0, hsLearned(f.Flags|fOut, p)
		return k, f, true
	})
}

func TestFuzzLearnRx(t *testing.T) {
	e := newFzEnv(t, true)
	g := fzGen{e.rng}
	fzLearnCheck(t, e, e.o.PrgFastpathLrnRx, false, g.rx, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		p, k, f, ok := e.learnable(b, 0, false)
		if !ok {
			return k, f, false
		}
		copy(f.InMac[:], b[:12])
		f.InIfindex, f.InTtlDec, f.InTtlSeen, f.Flags = 1, f.InTtlSeen-p.ttl, 0, hsLearned(f.Flags|fIn, p)
		return k, f, true
	})
}
