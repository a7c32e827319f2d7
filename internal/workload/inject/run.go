package inject

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/workload/pinned"
)

// ErrStalled is returned (wrapped) when the kernel accepted no frame for Config.StallTimeout.
var ErrStalled = errors.New("injector stalled: no frame accepted")

// Backoff bounds after a refusal: short enough to keep the receiver fed, long enough for a veth
// peer's backlog to drain a little (a 1000-packet backlog drains in ~1-5 ms at 0.2-1 Mpps).
const (
	backoffMin = 20 * time.Microsecond
	backoffMax = 1 * time.Millisecond
)

// Run injects frames as cfg describes until the duration or count is reached or ctx ends
// (ctx ending is not an error). It returns what was sent even when it fails.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	c, err := cfg.WithDefaults()
	if err != nil {
		return Stats{CPU: -1}, err
	}
	if c.Method == MethodXDP {
		return runXDP(ctx, c)
	}
	sock, err := openPacket(c.Netns, c.Device, c.QdiscBypass)
	if err != nil {
		return Stats{CPU: -1}, err
	}
	defer sock.Close()
	if c.SrcMAC.IsZero() {
		c.SrcMAC = sock.mac
	}
	if l := c.FrameLen() - EthLen; l > sock.mtu {
		return Stats{CPU: -1}, fmt.Errorf("frame of %d bytes (IP length %d) exceeds %s's MTU %d: lower payload_size",
			c.FrameLen(), l, c.Device, sock.mtu)
	}

	// The send loop runs on its own locked thread so that pinning it pins exactly the sender.
	st := Stats{CPU: -1, Method: MethodPacket}
	err = pinned.Do(c.CPU, "sender", func() error {
		if c.CPU != nil {
			st.CPU = *c.CPU
		}
		cpu0 := threadCPUTime()
		var err error
		st, err = sendLoop(ctx, c, sock, st)
		st.SenderCPUNs = threadCPUTime() - cpu0
		return err
	})
	return st, err
}

// sender holds the prebuilt frames and the message vectors of one batch.
type sender struct {
	frames  [][][]byte // [flow][copy] -> frame; a flow needs ceil(batch/flows) copies per batch
	off     int        // payload offset in a frame: where the sequence header is written
	seq     []uint64   // next sequence number per flow
	msgs    []unix.Mmsghdr
	iovs    []unix.Iovec
	flowCur int // flow of the next frame to build
}

func newSender(c Config) *sender {
	copies := (c.Batch + c.Flows - 1) / c.Flows
	s := &sender{
		frames: make([][][]byte, c.Flows),
		off:    c.Headroom(),
		seq:    make([]uint64, c.Flows),
		msgs:   make([]unix.Mmsghdr, c.Batch),
		iovs:   make([]unix.Iovec, c.Batch),
	}
	for f := range s.frames {
		tmpl := BuildFrame(c, f)
		s.frames[f] = make([][]byte, copies)
		for k := range copies {
			s.frames[f][k] = append([]byte(nil), tmpl...)
		}
	}
	return s
}

// fill prepares n frames into msgs[0:n]. Flows go round robin, so within one batch flow f sits at
// slots j, j+F, j+2F...; slot j uses copy j/F, which is distinct for each occurrence of a flow.
// Sequence numbers are written in place: the kernel copies the frame during sendmmsg, so a buffer
// is free again as soon as the call returns.
func (s *sender) fill(n int) {
	nf := len(s.frames)
	for j := range n {
		f := s.flowCur
		buf := s.frames[f][j/nf]
		PutPayloadHeader(buf[s.off:], s.seq[f], uint32(f))
		s.seq[f]++
		s.flowCur++
		if s.flowCur == nf {
			s.flowCur = 0
		}
		s.iovs[j] = unix.Iovec{Base: &buf[0]}
		s.iovs[j].SetLen(len(buf))
		s.msgs[j] = unix.Mmsghdr{}
		s.msgs[j].Hdr.Iov = &s.iovs[j]
		s.msgs[j].Hdr.SetIovlen(1)
	}
}

func sendLoop(ctx context.Context, c Config, sock *packetSock, st Stats) (Stats, error) {
	s := newSender(c)
	frameLen := c.FrameLen()
	st.FrameLen, st.Flows = frameLen, c.Flows
	p := pacer{rate: c.Rate}

	start := time.Now()
	var deadline time.Time
	if c.Duration > 0 {
		deadline = start.Add(c.Duration)
	}
	var built uint64      // frames given a sequence number
	head, pending := 0, 0 // msgs[head:head+pending] are built but not yet accepted
	backoff := backoffMin
	var refusedSince time.Time // start of the current run of refusals; zero while sends succeed
	var lastErr error
	var prevReturn time.Time

	finish := func(err error) (Stats, error) {
		st.Duration = time.Since(start)
		st.Unsent = uint64(pending)
		if st.Duration > 0 {
			st.PPS = float64(st.Sent) / st.Duration.Seconds()
		}
		if lastErr != nil {
			st.LastError = lastErr.Error()
		}
		return st, err
	}

	for {
		if ctx.Err() != nil {
			return finish(nil)
		}
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return finish(nil)
		}
		if pending == 0 {
			if c.Count > 0 && built >= c.Count {
				return finish(nil)
			}
			want := c.Batch
			if c.Count > 0 && c.Count-built < uint64(want) {
				want = int(c.Count - built)
			}
			n, wait := p.allow(now, want)
			if n == 0 {
				sleepUntil(ctx, now.Add(wait), deadline)
				continue
			}
			p.took(n)
			s.fill(n)
			built += uint64(n)
			head, pending = 0, n
		}

		callStart := time.Now()
		n, err := sock.sendmmsg(s.msgs[head : head+pending])
		callEnd := time.Now()
		st.Syscalls++
		if d := callEnd.Sub(callStart); d > st.MaxCall {
			st.MaxCall = d
		}
		if !prevReturn.IsZero() {
			if g := callEnd.Sub(prevReturn); g > st.MaxGap {
				st.MaxGap = g
			}
		}
		prevReturn = callEnd
		if n > 0 {
			st.Sent += uint64(n)
			st.Attempted += uint64(n)
			st.Bytes += uint64(n * frameLen)
			head += n
			pending -= n
			backoff = backoffMin
			refusedSince = time.Time{}
		}
		if err == nil && pending > 0 {
			// Partial batch: the kernel refused msgs[head] and dropped the error. Count the
			// refusal now; the retry tells us whether the device is still busy.
			st.Refused++
			st.Attempted++
			continue
		}
		if err == nil || errors.Is(err, unix.EINTR) {
			continue
		}
		if !transient(err) {
			lastErr = err
			return finish(fmt.Errorf("sendmmsg on %s: %w", c.Device, err))
		}
		st.Refused++
		st.Attempted++
		lastErr = err
		if refusedSince.IsZero() {
			refusedSince = now
		} else if now.Sub(refusedSince) > c.StallTimeout {
			return finish(fmt.Errorf("%w for %v on %s (last error: %v)", ErrStalled, c.StallTimeout, c.Device, err))
		}
		st.Backoffs++
		sleepUntil(ctx, time.Now().Add(backoff), deadline)
		backoff = min(2*backoff, backoffMax)
	}
}

// sleepUntil sleeps until t, but never past the run's deadline or ctx's end.
func sleepUntil(ctx context.Context, t, deadline time.Time) {
	if !deadline.IsZero() && deadline.Before(t) {
		t = deadline
	}
	d := time.Until(t)
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}
