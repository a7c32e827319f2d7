package inject

import "time"

// pacer spreads frames at a fixed rate. It allows a batch ahead of schedule (bursts of at most
// one batch) and forgets debt older than maxDebt, so that after a backpressure pause the injector
// resumes at the configured rate instead of firing a catch-up burst into a receiver that just
// recovered.
type pacer struct {
	rate float64   // frames per second; 0 = unpaced
	next time.Time // when the next frame is due
	// maxDebt is how far behind schedule the pacer may fall and still catch up (default
	// defaultMaxDebt): senders whose calls are long need more.
	maxDebt time.Duration
}

const defaultMaxDebt = 5 * time.Millisecond

// allow returns how many frames (<= max) may go now, or, when none may, how long to wait.
func (p *pacer) allow(now time.Time, max int) (int, time.Duration) {
	if p.rate <= 0 {
		return max, 0
	}
	debt := p.maxDebt
	if debt == 0 {
		debt = defaultMaxDebt
	}
	switch {
	case p.next.IsZero():
		p.next = now
	case now.Sub(p.next) > debt:
		p.next = now.Add(-debt)
	}
	if now.Before(p.next) {
		return 0, p.next.Sub(now)
	}
	n := int(now.Sub(p.next).Seconds()*p.rate) + 1
	if n > max {
		n = max
	}
	return n, 0
}

// took records that n frames were scheduled.
func (p *pacer) took(n int) {
	if p.rate > 0 {
		p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	}
}
