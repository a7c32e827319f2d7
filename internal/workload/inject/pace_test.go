package inject

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	p := pacer{rate: 1000} // one frame per ms
	t0 := time.Unix(1000, 0)
	if n, _ := p.allow(t0, 64); n != 1 {
		t.Fatalf("first allow: %d, want 1", n)
	}
	p.took(1)
	if n, wait := p.allow(t0, 64); n != 0 || wait != time.Millisecond {
		t.Fatalf("ahead of schedule: n %d wait %v", n, wait)
	}
	// 3 ms later three more frames are due.
	if n, _ := p.allow(t0.Add(3*time.Millisecond), 64); n != 3 {
		t.Fatalf("after 3 ms: %d, want 3", n)
	}
	// After a long pause the debt is capped at maxDebt: no catch-up burst.
	p = pacer{rate: 1000}
	p.allow(t0, 1)
	p.took(1)
	n, _ := p.allow(t0.Add(time.Second), 1000)
	if n > int(defaultMaxDebt/time.Millisecond)+1 {
		t.Fatalf("after a 1 s pause: burst of %d", n)
	}
	if n, _ := (&pacer{}).allow(t0, 64); n != 64 {
		t.Fatalf("unpaced: %d", n)
	}
}
