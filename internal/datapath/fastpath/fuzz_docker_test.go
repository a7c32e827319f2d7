package fastpath

import (
	"bytes"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Docker layout: prg_fastpath_dtx redirects a cached flow to the VXLAN device unchanged (marked
// for its learner), prg_fastpath_drx hands an inner frame straight to the pod, and
// prg_fastpath_dlrn_tx learns the bridge's Ethernet header; every other frame goes on unchanged.

func TestFuzzDockerTx(t *testing.T) {
	e := newFzEnvLayout(t, false, true)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), g.tx, func(b []byte) {
		in := append([]byte{}, b...)
		hit := false
		if p, r := e.fzParseFast(in, 0, true); r == fzParsed {
			f, ok := e.learned(p.keyOut(), fOut|fIn)
			hit = ok && f.OutIfindex == 1 && bytes.Equal(in[:12], f.Tmpl[:12]) && f.OutTtlDec == 0
		}
		ret, out, mark := e.fzRun(e.o.PrgFastpathDtx, b, 0, 0)
		want, wmark := tcxNext, uint32(0)
		if hit {
			want, wmark = tcActRedirect, markFast
			hits++
		}
		if ret != uint32(want) || mark != wmark || !bytes.Equal(out, in) {
			t.Errorf("dtx: verdict %d mark %#x, model %d %#x; frame changed %v: % x", int32(ret), mark, int32(want), wmark, !bytes.Equal(out, in), in)
		}
	})
	fzCovered(t, runs, hits, "redirected")
}

func TestFuzzDockerRx(t *testing.T) {
	e := newFzEnvLayout(t, false, true)
	g := fzGen{e.rng}
	hits := 0
	runs := e.fzEach(frames.FuzzCount(20000), g.rx, func(b []byte) {
		in := append([]byte{}, b...)
		want := []byte(nil)
		if p, r := e.fzParseFast(in, 0, false); r == fzParsed {
			f, ok := e.learned(p.keyIn(), fOut|fIn)
			pod, live := e.pods[p.daddr]
			if ok && live && pod.state == podLive && pod.v.Ifindex == f.InIfindex && bytes.Equal(pod.v.CtrMac[:], f.InMac[:6]) &&
				bytes.Equal(in[:6], f.InMac[:6]) && f.InTtlDec == 0 {
				want = append(append([]byte{}, f.InMac[:]...), in[12:]...)
			}
		}
		ret, out, _ := e.fzRun(e.o.PrgFastpathDrx, b, 0, 0)
		switch {
		case want == nil && (ret != tcxNext || !bytes.Equal(out, in)):
			t.Errorf("drx: model: normal path; program: verdict %d, changed %v: % x", int32(ret), !bytes.Equal(out, in), in)
		case want != nil && (ret != tcActRedirect || !bytes.Equal(out, want)):
			t.Errorf("drx: model: to the pod; program: verdict %d\n in % x\nout % x\nwant % x", int32(ret), in, out, want)
		}
		if want != nil {
			hits++
		}
	})
	fzCovered(t, runs, hits, "delivered")
}

func TestFuzzDockerLearnTx(t *testing.T) {
	e := newFzEnvLayout(t, true, true)
	g := fzGen{e.rng}
	fzLearnCheck(t, e, e.o.PrgFastpathDlrnTx, true, g.tx, func(b []byte) (fpFpKey, fpFpFlow, bool) {
		p, k, f, ok := e.learnable(b, 0, true)
		if !ok {
			return k, f, false
		}
		copy(f.Tmpl[:14], b[:14])
		f.OutTtlDec, f.OutTtlSeen, f.Flags = f.OutTtlSeen-p.ttl, 0, hsLearned(f.Flags|fOut, p)
		return k, f, true
	})
}
