package udpsink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
	"github.com/peregrine-net/peregrine/internal/workload/pinned"
)

// Sink is a bound UDP socket waiting for Run. Listen and Run are separate so a caller can start
// the sender only once the port exists (nothing is lost to "port unreachable" at the start).
type Sink struct {
	cfg    Config
	fd     int
	rcvbuf int
	before udpCounters
	used   bool
}

// Listen opens and binds the socket inside cfg.Netns.
func Listen(cfg Config) (*Sink, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Sink{cfg: c, fd: -1}
	err = netnsutil.Do(c.Netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		if err != nil {
			return fmt.Errorf("udp socket: %w", err)
		}
		s.fd = fd
		// FORCE ignores net.core.rmem_max (we are root); fall back to the clamped option.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, c.RcvBuf); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, c.RcvBuf); err != nil {
				return fmt.Errorf("SO_RCVBUF %d: %w", c.RcvBuf, err)
			}
		}
		// A receive timeout lets the blocking recvmmsg loop notice the deadline and ctx.
		tv := unix.NsecToTimeval(pollInterval.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
		sa := &unix.SockaddrInet4{Port: int(c.Port), Addr: c.Addr.As4()}
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("bind %s:%d in namespace %q: %w", c.Addr, c.Port, c.Netns, err)
		}
		s.rcvbuf, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
		return nil
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		return nil, err
	}
	if s.before, err = readUDPCounters(c.Netns); err != nil {
		unix.Close(s.fd)
		return nil, err
	}
	return s, nil
}

// AddrPort is the address the sink listens on.
func (s *Sink) AddrPort() netip.AddrPort { return netip.AddrPortFrom(s.cfg.Addr, s.cfg.Port) }

// Close releases the socket. It is safe to call more than once.
func (s *Sink) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// Run receives until the duration, the idle timeout or ctx ends the run (none of them is an
// error), then returns the statistics. A Sink runs once.
func (s *Sink) Run(ctx context.Context) (Stats, error) {
	if s.used || s.fd < 0 {
		return Stats{CPU: -1}, errors.New("udpsink: Run called twice or after Close")
	}
	s.used = true
	// A dedicated locked thread so the CPU pin applies to the receive loop alone.
	st := Stats{CPU: -1}
	err := pinned.Do(s.cfg.CPU, "receiver", func() error {
		if s.cfg.CPU != nil {
			st.CPU = *s.cfg.CPU
		}
		var err error
		st, err = s.loop(ctx, st)
		return err
	})
	st.RcvBuf = s.rcvbuf
	if d, derr := socketDrops(s.fd); derr == nil {
		st.SocketDrops = d
	} else {
		err = errors.Join(err, derr)
	}
	after, cerr := readUDPCounters(s.cfg.Netns)
	if cerr != nil {
		return st, errors.Join(err, cerr)
	}
	st.InErrors = after.InErrors - s.before.InErrors
	st.RcvbufErrors = after.RcvbufErrors - s.before.RcvbufErrors
	st.MemErrors = after.MemErrors - s.before.MemErrors
	return st, err
}

// Run is Listen, Run and Close in one call, for callers that start the sender independently.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	s, err := Listen(cfg)
	if err != nil {
		return Stats{CPU: -1}, err
	}
	defer s.Close()
	return s.Run(ctx)
}

// flowKey identifies a sequence space: the sender's address and port and its flow id.
type flowKey struct {
	src  [4]byte
	port uint16
	flow uint32
}

func (s *Sink) loop(ctx context.Context, st Stats) (Stats, error) {
	n := s.cfg.Batch
	bufs := make([]byte, n*bufSize)
	names := make([]unix.RawSockaddrInet4, n)
	iovs := make([]unix.Iovec, n)
	msgs := make([]unix.Mmsghdr, n)
	for i := range n {
		iovs[i] = unix.Iovec{Base: &bufs[i*bufSize]}
		iovs[i].SetLen(bufSize)
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
		msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
	}
	flows := make(map[flowKey]*flowSeq)
	hist := newHistogram()

	start := time.Now()
	deadline := start.Add(s.cfg.Duration)
	var first, last time.Time
	finish := func(err error) (Stats, error) {
		st.Elapsed = time.Since(start)
		if !first.IsZero() {
			st.Active = last.Sub(first)
		}
		if st.Active > 0 {
			st.PPS = float64(st.Received) / st.Active.Seconds()
		}
		st.Flows = len(flows)
		for _, f := range flows {
			st.Lost += f.lost()
			st.Expected += f.span()
		}
		st.ReorderHist = hist
		return st, err
	}

	for {
		if ctx.Err() != nil {
			return finish(nil)
		}
		now := time.Now()
		if !now.Before(deadline) {
			return finish(nil)
		}
		if s.cfg.IdleTimeout > 0 && !last.IsZero() && now.Sub(last) >= s.cfg.IdleTimeout {
			return finish(nil)
		}
		for i := range msgs {
			msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet4 // the kernel overwrites it per call
		}
		got, err := recvmmsg(s.fd, msgs)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue // poll timeout: re-check deadline and ctx
			}
			return finish(fmt.Errorf("recvmmsg on %s: %w", s.AddrPort(), err))
		}
		now = time.Now()
		if first.IsZero() {
			first = now
		}
		last = now
		for i := range got {
			l := int(msgs[i].Len)
			st.Received++
			st.Bytes += uint64(l)
			p := bufs[i*bufSize : i*bufSize+min(l, bufSize)]
			seq, flow, ok := inject.ParsePayload(p)
			if !ok {
				st.Foreign++
				continue
			}
			k := flowKey{src: names[i].Addr, port: binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&names[i].Port))[:]), flow: flow}
			f := flows[k]
			if f == nil {
				f = new(flowSeq)
				flows[k] = f
			}
			o := f.observe(seq)
			switch {
			case o.duplicate:
				st.Duplicates++
			case o.reordered:
				st.Reordered++
				addToHistogram(hist, o.distance)
			}
		}
	}
}
