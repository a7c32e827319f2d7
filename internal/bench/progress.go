package bench

import (
	"fmt"
	"io"
	"time"
)

// progress prints one line per measurement with an ETA from the average so far.
type progress struct {
	w     io.Writer
	total int
	done  int
	start time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: total, start: time.Now()}
}

func (p *progress) step(what string) {
	if p.w == nil {
		return
	}
	p.done++
	elapsed := time.Since(p.start)
	eta := "?"
	if p.done > 0 {
		left := time.Duration(float64(elapsed) / float64(p.done) * float64(p.total-p.done))
		eta = left.Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "[%3d/%d %3.0f%% ETA %s] %s\n", p.done, p.total, 100*float64(p.done)/float64(p.total), eta, what)
}
