package workload

import (
	"math"
	"math/bits"
	"time"
)

// histSubBits sets the histogram's resolution: 2^7 = 128 linear sub-buckets per power of
// two, so a reported percentile is within 0.8 % of the true sample, at a fixed ~35 KB per
// histogram however long the run is.
const histSubBits = 7

// histBuckets covers values up to 2^(histSubBits+histMaxExp) ns, far beyond any sane latency.
const histMaxExp = 40

// latencyHist is a log-linear histogram of nanosecond latencies (HDR-histogram style).
// It is not safe for concurrent use: each worker keeps its own and they are merged.
type latencyHist struct {
	counts [(histMaxExp + 1) << histSubBits]uint64
	n      uint64
	sum    float64 // ns
	min    uint64
	max    uint64
}

// bucketOf maps v to its bucket: values below 2^histSubBits get one bucket each; above,
// each power-of-two range [2^k, 2^(k+1)) is split into 2^histSubBits equal buckets.
func bucketOf(v uint64) int {
	if v < 1<<histSubBits {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // shift that leaves the top histSubBits+1 bits
	i := (e+1)<<histSubBits + int(v>>uint(e)) - 1<<histSubBits
	if i >= len(latencyHist{}.counts) {
		i = len(latencyHist{}.counts) - 1
	}
	return i
}

// bucketLow is the smallest value of bucket i and width its size.
func bucketLow(i int) (low, width uint64) {
	if i < 2<<histSubBits {
		return uint64(i), 1
	}
	e := uint(i>>histSubBits) - 1
	m := uint64(i&(1<<histSubBits-1)) + 1<<histSubBits
	return m << e, 1 << e
}

func (h *latencyHist) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

func (h *latencyHist) merge(o *latencyHist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// quantileUs returns the q-quantile (0..1) in microseconds: the middle of the bucket that
// holds the ceil(q·n)-th smallest sample, clamped to the exact min and max.
func (h *latencyHist) quantileUs(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	if rank == h.n {
		return float64(h.max) / 1e3 // the largest sample is known exactly
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, w := bucketLow(i)
			v := low + (w-1)/2
			v = min(max(v, h.min), h.max)
			return float64(v) / 1e3
		}
	}
	return float64(h.max) / 1e3
}

func (h *latencyHist) meanUs() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n) / 1e3
}
