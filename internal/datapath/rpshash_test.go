package datapath

import "testing"

// Known vectors for the Go mirror of bpf/rps.h, worked out by hand from the formulas there (and
// the kernel's reciprocal_scale): lo = ceil(idx * 2^32 / n), hi = ceil((idx+1) * 2^32 / n),
// h = lo + fh % (hi - lo), 0 avoided. falcon's TestVectorsMatchProgram checks hashes the program
// wrote; these need no root and fail on any change of the arithmetic.
func TestRPSHashVectors(t *testing.T) {
	for _, v := range []struct{ idx, n, fh, want uint32 }{
		{0, 1, 0, 1},                   // lo 0, h 0: "no hash" is avoided
		{0, 1, 0xdeadbeef, 0xdeadbeef}, // one CPU: the flow hash itself
		{1, 3, 0, 0x55555556},          // ceil(2^32/3)
		{2, 3, 0xffffffff, 0xaaaaaaab}, // 0xffffffff % 0x55555555 = 0: ceil(2*2^32/3)
		{1, 3, 7, 0x5555555d},
		{7, 8, 0xf921f116, 0xf921f116}, // 0xe0000000 + fh % 2^29 (falcon's first vector)
		{63, 64, 5, 0xfc000005},
	} {
		got := RPSHash(v.idx, v.n, v.fh)
		if got != v.want {
			t.Errorf("RPSHash(%d, %d, %#x) = %#x, want %#x", v.idx, v.n, v.fh, got, v.want)
		}
		if ReciprocalScale(got, v.n) != v.idx {
			t.Errorf("RPSHash(%d, %d, %#x) = %#x maps to index %d", v.idx, v.n, v.fh, got, ReciprocalScale(got, v.n))
		}
	}
	for _, v := range []struct{ h, n, want uint32 }{
		{0x55555555, 3, 0}, {0x55555556, 3, 1}, {0xffffffff, 64, 63}, {0x80000000, 2, 1}, {0x7fffffff, 2, 0}, {0, 5, 0},
	} {
		if got := ReciprocalScale(v.h, v.n); got != v.want {
			t.Errorf("ReciprocalScale(%#x, %d) = %d, want %d", v.h, v.n, got, v.want)
		}
	}
	for _, v := range []struct {
		cpus      []int
		cpu, want int
	}{{[]int{5, 1, 3}, 3, 1}, {[]int{5, 1, 3}, 5, 2}, {[]int{5, 1, 3}, 1, 0}, {[]int{5, 1, 3}, 4, -1}, {nil, 0, -1}} {
		if got := RPSIndex(v.cpus, v.cpu); got != v.want {
			t.Errorf("RPSIndex(%v, %d) = %d, want %d", v.cpus, v.cpu, got, v.want)
		}
	}
}
