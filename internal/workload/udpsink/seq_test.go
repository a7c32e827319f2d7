package udpsink

import "testing"

func feed(seqs ...uint64) (f *flowSeq, dup, reord uint64, hist []ReorderBucket) {
	f = new(flowSeq)
	hist = newHistogram()
	for _, s := range seqs {
		o := f.observe(s)
		if o.duplicate {
			dup++
		}
		if o.reordered {
			reord++
			addToHistogram(hist, o.distance)
		}
	}
	return f, dup, reord, hist
}

func TestFlowSeq(t *testing.T) {
	cases := []struct {
		name             string
		seqs             []uint64
		lost, dup, reord uint64
	}{
		{"in order", []uint64{0, 1, 2, 3, 4}, 0, 0, 0},
		{"gap", []uint64{0, 1, 4, 5}, 2, 0, 0},
		{"swap", []uint64{0, 2, 1, 3}, 0, 0, 1},
		{"late fill of a gap", []uint64{0, 3, 1, 2}, 0, 0, 2},
		{"duplicate of max", []uint64{0, 1, 1, 2}, 0, 1, 0},
		{"duplicate below max", []uint64{0, 1, 2, 1}, 0, 1, 0},
		{"late start", []uint64{100, 101, 103}, 1, 0, 0},
		{"below the first seen", []uint64{5, 6, 3}, 1, 0, 1}, // 4 missing
		{"big jump then late", []uint64{0, 10000, 9000, 9000}, 9998, 1, 1},
		{"beyond window", []uint64{0, 10000, 1}, 9998, 0, 1},
	}
	for _, c := range cases {
		f, dup, reord, _ := feed(c.seqs...)
		if f.lost() != c.lost || dup != c.dup || reord != c.reord {
			t.Errorf("%s: lost %d dup %d reord %d, want %d %d %d", c.name, f.lost(), dup, reord, c.lost, c.dup, c.reord)
		}
	}
}

func TestFlowSeqWindowWrap(t *testing.T) {
	// Bits of numbers a window ago must not make a fresh gap look received.
	var seqs []uint64
	for s := uint64(0); s < 3*window; s++ {
		if s != 2*window+5 {
			seqs = append(seqs, s)
		}
	}
	seqs = append(seqs, 2*window+5) // the late one: reordered, not a duplicate
	f, dup, reord, hist := feed(seqs...)
	if f.lost() != 0 || dup != 0 || reord != 1 {
		t.Fatalf("lost %d dup %d reord %d", f.lost(), dup, reord)
	}
	if d := uint64(3*window-1) - (2*window + 5); hist[len(hist)-1].Count != 1 || d <= 1023 {
		t.Fatalf("distance %d not in the last bucket: %+v", d, hist)
	}
}

func TestHistogram(t *testing.T) {
	h := newHistogram()
	for _, d := range []uint64{1, 2, 3, 4, 15, 16, 63, 64, 255, 256, 1023, 1024, 1 << 40} {
		addToHistogram(h, d)
	}
	want := []uint64{1, 2, 2, 2, 2, 2, 2}
	for i, b := range h {
		if b.Count != want[i] {
			t.Fatalf("bucket %d [%d,%d]: %d, want %d", i, b.Min, b.Max, b.Count, want[i])
		}
	}
	if h[0].Min != 1 || h[0].Max != 1 || h[1].Min != 2 || h[len(h)-1].Max != 0 {
		t.Fatalf("bounds: %+v", h)
	}
}

func TestParseSNMP(t *testing.T) {
	in := []byte("Ip: Forwarding DefaultTTL\nIp: 2 64\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"Udp: 10 1 7 3 5 0 0 0 2\n" +
		"UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"UdpLite: 0 0 0 0 0 0 0 0 0\n")
	v, err := parseSNMP(in, "Udp")
	if err != nil {
		t.Fatal(err)
	}
	if v["InErrors"] != 7 || v["RcvbufErrors"] != 5 || v["MemErrors"] != 2 || v["InDatagrams"] != 10 {
		t.Fatalf("%v", v)
	}
	if _, err := parseSNMP(in, "Tcp"); err == nil {
		t.Fatal("missing protocol accepted")
	}
}
