package udpsink

// Per-flow sequence accounting. A flow's sequence numbers should arrive as 0, 1, 2, ...; we keep
// the highest seen (max), the lowest seen (base, so a sink started late does not count what it
// never had a chance to see as lost), the count of distinct numbers, and a bitmap of the last
// window numbers below max to tell a late packet (reordered) from a second copy (duplicate).

const window = 4096 // sequence numbers of history per flow; 512 bytes of bitmap

type flowSeq struct {
	started bool
	base    uint64
	max     uint64
	unique  uint64
	bits    [window / 64]uint64 // bit (seq % window) set = seq received, for seq in (max-window, max]
}

func (f *flowSeq) has(s uint64) bool { return f.bits[(s%window)/64]&(1<<(s%64)) != 0 }
func (f *flowSeq) set(s uint64)      { f.bits[(s%window)/64] |= 1 << (s % 64) }
func (f *flowSeq) clear(s uint64)    { f.bits[(s%window)/64] &^= 1 << (s % 64) }

// lost is the number of sequence numbers in [base, max] never received. Losses after the last
// packet the flow got (a lost tail) are invisible here; compare with the sender's count for those.
func (f *flowSeq) lost() uint64 {
	if !f.started {
		return 0
	}
	return f.max - f.base + 1 - f.unique
}

// span is the count of sequence numbers in [base, max].
func (f *flowSeq) span() uint64 {
	if !f.started {
		return 0
	}
	return f.max - f.base + 1
}

// outcome of one packet for the aggregate counters.
type outcome struct {
	duplicate bool
	reordered bool
	distance  uint64 // max - seq for a reordered packet
}

func (f *flowSeq) observe(s uint64) outcome {
	switch {
	case !f.started:
		f.started, f.base, f.max, f.unique = true, s, s, 1
		f.set(s)
		return outcome{}
	case s > f.max:
		if s-f.max >= window {
			f.bits = [window / 64]uint64{}
		} else {
			// Numbers skipped over are a gap for now; clear their stale bits from window ago.
			for g := f.max + 1; g < s; g++ {
				f.clear(g)
			}
		}
		f.set(s)
		f.max = s
		f.unique++
		return outcome{}
	case s == f.max:
		return outcome{duplicate: true}
	}
	d := f.max - s
	if d < window {
		if f.has(s) {
			return outcome{duplicate: true}
		}
		f.set(s)
	}
	// Older than the window we cannot tell a duplicate apart; we count it as a late original.
	if s < f.base {
		f.base = s
	}
	f.unique++
	return outcome{reordered: true, distance: d}
}

// ReorderBucket counts reordered packets whose distance (highest sequence seen minus their own)
// lies in [Min, Max]; Max 0 means unbounded.
type ReorderBucket struct {
	Min   uint64 `json:"min"`
	Max   uint64 `json:"max"`
	Count uint64 `json:"count"`
}

// bucketBounds are coarse on purpose: 1 (a neighbour swap), a few, within one batch of 64,
// within a typical backlog/ring of 1000, and beyond.
var bucketBounds = []uint64{1, 3, 15, 63, 255, 1023, 0}

func newHistogram() []ReorderBucket {
	h := make([]ReorderBucket, len(bucketBounds))
	lo := uint64(1)
	for i, hi := range bucketBounds {
		h[i] = ReorderBucket{Min: lo, Max: hi}
		lo = hi + 1
	}
	return h
}

func addToHistogram(h []ReorderBucket, d uint64) {
	for i := range h {
		if h[i].Max == 0 || d <= h[i].Max {
			h[i].Count++
			return
		}
	}
}
