package pipedevice

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PerfConfig drives `peregrine pd perf` (both ends).
type PerfConfig struct {
	Transport string // "pd" or "tcp" (tcp also serves the sockmap shortcut: same sockets)
	Socket    string // pd daemon socket
	Addr      netip.AddrPort
	Size      int           // message size
	Duration  time.Duration // throughput run length
	Conns     int
	Latency   bool // ping-pong of Size bytes instead of a stream
	Count     int  // ping-pongs (latency)
	Ring      int  // pd: receive ring per socket (0: daemon default)
	// NoTouch skips producing and consuming the payload. By default the sender writes every
	// message it sends (as an application produces its data) and the receiver reads every byte it
	// gets, in every transport, so a zero-copy path is not credited with data nobody touched.
	NoTouch bool
	// Spin is how many times a waiting end looks (yielding the CPU between) before it sleeps on
	// its eventfd; -1: 50 for latency runs, 0 for streams. Longer spins leave three busy
	// threads (both ends and the engine) on two vCPUs and a worse tail.
	Spin int
}

func (cfg *PerfConfig) spinLooks() int {
	if cfg.Spin >= 0 {
		return cfg.Spin
	}
	if cfg.Latency {
		return 50
	}
	return 0
}

var touchSink uint64

// warmup is how many round trips a latency run makes before it starts recording (page faults,
// caches, the first wake-ups), as sockperf does.
func warmup(count int) int { return min(max(count/10, 10), 1000) }

// consume reads every byte of b (eight at a time), as a receiver that uses its data does.
func consume(b []byte) {
	var sum uint64
	n := len(b) / 8
	if n > 0 {
		for _, x := range unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n) {
			sum += x
		}
	}
	for _, x := range b[n*8:] {
		sum += uint64(x)
	}
	touchSink += sum
}

// pattern is the payload senders write into each message.
func pattern(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// PerfResult is one end's figures. CPU is this process's user+system time.
type PerfResult struct {
	Role       string    `json:"role"`
	Transport  string    `json:"transport"`
	Size       int       `json:"size"`
	Conns      int       `json:"conns"`
	Seconds    float64   `json:"seconds"`
	Bytes      int64     `json:"bytes"`
	Gbps       float64   `json:"gbps"`
	CPUSeconds float64   `json:"cpu_seconds"`
	PerConn    []int64   `json:"per_conn_bytes,omitempty"`
	RTTp50us   float64   `json:"rtt_p50_us,omitempty"`
	RTTp99us   float64   `json:"rtt_p99_us,omitempty"`
	RTTsamples int       `json:"rtt_samples,omitempty"`
	Direct     bool      `json:"direct,omitempty"`
	rtts       []float64 `json:"-"`
}

func cpuSeconds() float64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func finish(r *PerfResult, start time.Time, cpu0 float64) *PerfResult {
	r.Seconds = time.Since(start).Seconds()
	r.CPUSeconds = cpuSeconds() - cpu0
	if r.Seconds > 0 {
		r.Gbps = float64(r.Bytes) * 8 / r.Seconds / 1e9
	}
	if len(r.rtts) > 0 {
		slices.Sort(r.rtts)
		r.RTTp50us = r.rtts[len(r.rtts)/2]
		r.RTTp99us = r.rtts[len(r.rtts)*99/100]
		r.RTTsamples = len(r.rtts)
	}
	return r
}

// ---------------------------------------------------------------- pd

// PerfServerPD accepts conns connections, sinks (or echoes, for latency) until all close.
func PerfServerPD(cfg PerfConfig, ready func()) (*PerfResult, error) {
	c, err := Dial(cfg.Socket, cfg.Ring, 0)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	l, err := c.Socket()
	if err != nil {
		return nil, err
	}
	if _, err := c.Bind(l, cfg.Addr); err != nil {
		return nil, fmt.Errorf("pd bind %v: %w", cfg.Addr, err)
	}
	if err := c.Listen(l, 65535); err != nil {
		return nil, err
	}
	if ready != nil {
		ready()
	}
	var sids []int
	var start time.Time
	var cpu0 float64
	for len(sids) < cfg.Conns {
		sid, _, err := c.Accept(l)
		if IsAgain(err) {
			c.Wait(func() bool { return c.Readable(l) }, 100*time.Millisecond)
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(sids) == 0 {
			start, cpu0 = time.Now(), cpuSeconds()
		}
		sids = append(sids, sid)
	}
	res := &PerfResult{Role: "server", Transport: "pd", Size: cfg.Size, Conns: cfg.Conns, PerConn: make([]int64, len(sids)), Direct: c.Direct}
	c.SpinLooks = cfg.spinLooks()
	open := len(sids)
	alive := make([]bool, len(sids))
	for i := range alive {
		alive[i] = true
	}
	var echo []byte
	got := make([]int, len(sids))
	for open > 0 {
		progress := false
		for i, sid := range sids {
			if !alive[i] {
				continue
			}
			v, err := c.Recv(sid, 1<<30)
			if IsAgain(err) {
				continue
			}
			if errors.Is(err, unix.ECONNRESET) {
				return nil, fmt.Errorf("pd daemon gone: %w", err)
			}
			if err != nil || v == nil {
				alive[i] = false
				open--
				c.CloseSock(sid)
				continue
			}
			progress = true
			n := len(v)
			if !cfg.NoTouch {
				consume(v)
			}
			res.PerConn[i] += int64(n)
			res.Bytes += int64(n)
			c.RecvDone(sid, n)
			if cfg.Latency {
				got[i] += n
				for got[i] >= cfg.Size {
					got[i] -= cfg.Size
					if echo, err = pdSendAll(c, sid, cfg.Size, echo, nil); err != nil {
						return nil, err
					}
				}
			}
		}
		if !progress {
			c.Wait(func() bool {
				for i, sid := range sids {
					if alive[i] && c.Readable(sid) {
						return true
					}
				}
				return false
			}, 100*time.Millisecond)
		}
	}
	c.CloseSock(l)
	return finish(res, start, cpu0), nil
}

// pdSendAll sends size bytes on sid, waiting for room; buf is reused in engine mode.
func pdSendAll(c *Client, sid, size int, buf []byte, src []byte) ([]byte, error) {
	if c.Direct || buf == nil {
		for {
			b, err := c.Malloc(sid, size)
			if err == nil {
				buf = b
				break
			}
			if !IsAgain(err) && err != unix.ENOMEM {
				return nil, err
			}
			c.Wait(func() bool { return c.Room(sid) >= size }, 10*time.Millisecond)
		}
	}
	if src != nil {
		copy(buf[:size], src)
	}
	for off := 0; off < size; {
		n, err := c.Send(sid, buf[off:size])
		if IsAgain(err) {
			c.Wait(func() bool { return c.Room(sid) > 0 }, 10*time.Millisecond)
			continue
		}
		if err != nil {
			return nil, err
		}
		off += n
	}
	if c.Direct {
		return nil, nil
	}
	return buf, nil
}

// PerfClientPD streams (or ping-pongs) over cfg.Conns connections from one thread.
func PerfClientPD(cfg PerfConfig) (*PerfResult, error) {
	c, err := Dial(cfg.Socket, cfg.Ring, 0)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	sids := make([]int, cfg.Conns)
	for i := range sids {
		if sids[i], err = c.Socket(); err != nil {
			return nil, err
		}
		if err := c.Connect(sids[i], cfg.Addr); err != nil {
			return nil, fmt.Errorf("pd connect %v: %w", cfg.Addr, err)
		}
	}
	res := &PerfResult{Role: "client", Transport: "pd", Size: cfg.Size, Conns: cfg.Conns, PerConn: make([]int64, len(sids)), Direct: c.Direct}
	var src []byte
	if !cfg.NoTouch {
		src = pattern(cfg.Size)
	}
	c.SpinLooks = cfg.spinLooks()
	start, cpu0 := time.Now(), cpuSeconds()
	if cfg.Latency {
		sid := sids[0]
		var buf []byte
		for i := -warmup(cfg.Count); i < cfg.Count; i++ {
			t0 := time.Now()
			if buf, err = pdSendAll(c, sid, cfg.Size, buf, src); err != nil {
				return nil, err
			}
			for got := 0; got < cfg.Size; {
				v, err := c.Recv(sid, cfg.Size-got)
				if IsAgain(err) {
					c.Wait(func() bool { return c.Readable(sid) }, 100*time.Millisecond)
					continue
				}
				if err != nil || v == nil {
					return nil, fmt.Errorf("echo: %v", err)
				}
				got += len(v)
				c.RecvDone(sid, len(v))
			}
			if i >= 0 {
				res.rtts = append(res.rtts, float64(time.Since(t0).Nanoseconds())/1e3)
			}
			res.Bytes += int64(cfg.Size)
		}
	} else {
		// Per connection: the message being sent and how far. Engine mode reuses a few pool
		// buffers per connection once pd_buf_refresh says so; direct mode reserves each message in
		// the peer's ring.
		type st struct {
			bufs [][]byte
			cur  []byte
			off  int
		}
		conns := make([]st, len(sids))
		deadline := start.Add(cfg.Duration)
		for it := 0; ; it++ {
			if it&63 == 0 && time.Now().After(deadline) {
				break
			}
			progress := false
			for i, sid := range sids {
				s := &conns[i]
				if s.cur == nil {
					s.cur = nextBuf(c, sid, cfg.Size, &s.bufs)
					if s.cur == nil {
						continue
					}
					if src != nil {
						copy(s.cur, src)
					}
					s.off = 0
				}
				n, err := c.Send(sid, s.cur[s.off:])
				if IsAgain(err) {
					continue
				}
				if err != nil {
					return nil, err
				}
				progress = true
				s.off += n
				res.PerConn[i] += int64(n)
				res.Bytes += int64(n)
				if s.off == len(s.cur) {
					s.cur = nil
				}
			}
			if !progress {
				if c.Dead() {
					return nil, fmt.Errorf("pd daemon gone: %w", unix.ECONNRESET)
				}
				c.Wait(func() bool {
					for _, sid := range sids {
						if c.Room(sid) > 0 {
							return true
						}
					}
					return false
				}, 10*time.Millisecond)
			}
		}
	}
	if c.Dead() {
		return nil, fmt.Errorf("pd daemon gone: %w", unix.ECONNRESET)
	}
	for _, sid := range sids {
		c.CloseSock(sid)
	}
	return finish(res, start, cpu0), nil
}

const perfBufs = 4

func nextBuf(c *Client, sid, size int, bufs *[][]byte) []byte {
	if c.Direct {
		b, err := c.Malloc(sid, size)
		if err != nil {
			return nil
		}
		return b
	}
	for _, b := range *bufs {
		if ok, _ := c.Reusable(b); ok { // an error (the daemon gone) is the caller's c.Dead()
			return b
		}
	}
	if len(*bufs) < perfBufs && (len(*bufs) == 0 || len(*bufs)*c.nsocks() < 8192) {
		if b, err := c.Malloc(-1, size); err == nil {
			*bufs = append(*bufs, b)
			return b
		}
	}
	return nil
}

// ---------------------------------------------------------------- tcp

// PerfServerTCP is the kernel TCP baseline's server (and the sockmap shortcut's: the same
// sockets, with prg_pd_sockmap redirecting between them when attached).
func PerfServerTCP(cfg PerfConfig, ready func(), onConn func(net.Conn)) (*PerfResult, error) {
	ln, err := net.Listen("tcp4", cfg.Addr.String())
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	if ready != nil {
		ready()
	}
	res := &PerfResult{Role: "server", Transport: "tcp", Size: cfg.Size, Conns: cfg.Conns, PerConn: make([]int64, cfg.Conns)}
	var wg sync.WaitGroup
	var total atomic.Int64
	var start time.Time
	var cpu0 float64
	for i := 0; i < cfg.Conns; i++ {
		conn, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		if onConn != nil {
			onConn(conn)
		}
		if tc, ok := conn.(*net.TCPConn); ok && !cfg.Latency {
			tc.SetNoDelay(false) // a stream lets Nagle batch small writes, as iperf does
		}
		if i == 0 {
			start, cpu0 = time.Now(), cpuSeconds()
		}
		wg.Add(1)
		go func(i int, conn net.Conn) {
			defer wg.Done()
			defer conn.Close()
			buf := make([]byte, max(cfg.Size, 256<<10))
			got := 0
			for {
				n, err := conn.Read(buf)
				if n > 0 {
					if !cfg.NoTouch {
						consume(buf[:n])
					}
					res.PerConn[i] += int64(n)
					total.Add(int64(n))
					if cfg.Latency {
						got += n
						for got >= cfg.Size {
							got -= cfg.Size
							if _, err := conn.Write(buf[:cfg.Size]); err != nil {
								return
							}
						}
					}
				}
				if err != nil {
					return
				}
			}
		}(i, conn)
	}
	wg.Wait()
	res.Bytes = total.Load()
	return finish(res, start, cpu0), nil
}

// PerfClientTCP streams (one goroutine per connection) or ping-pongs over kernel TCP.
func PerfClientTCP(cfg PerfConfig, onConn func(net.Conn)) (*PerfResult, error) {
	conns := make([]net.Conn, cfg.Conns)
	for i := range conns {
		c, err := net.Dial("tcp4", cfg.Addr.String())
		if err != nil {
			return nil, err
		}
		if onConn != nil {
			onConn(c)
		}
		if tc, ok := c.(*net.TCPConn); ok && !cfg.Latency {
			tc.SetNoDelay(false)
		}
		conns[i] = c
	}
	res := &PerfResult{Role: "client", Transport: "tcp", Size: cfg.Size, Conns: cfg.Conns, PerConn: make([]int64, cfg.Conns)}
	start, cpu0 := time.Now(), cpuSeconds()
	if cfg.Latency {
		c := conns[0]
		buf, src := make([]byte, cfg.Size), pattern(cfg.Size)
		for i := -warmup(cfg.Count); i < cfg.Count; i++ {
			t0 := time.Now()
			if !cfg.NoTouch {
				copy(buf, src)
			}
			if _, err := c.Write(buf); err != nil {
				return nil, err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return nil, err
			}
			if i >= 0 {
				res.rtts = append(res.rtts, float64(time.Since(t0).Nanoseconds())/1e3)
			}
			res.Bytes += int64(cfg.Size)
		}
	} else {
		deadline := start.Add(cfg.Duration)
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Add(1)
			go func(i int, c net.Conn) {
				defer wg.Done()
				buf, src := make([]byte, cfg.Size), pattern(cfg.Size)
				for n := 0; ; n++ {
					if n&15 == 0 && time.Now().After(deadline) {
						return
					}
					if !cfg.NoTouch {
						copy(buf, src)
					}
					k, err := c.Write(buf)
					res.PerConn[i] += int64(k)
					if err != nil {
						return
					}
				}
			}(i, c)
		}
		wg.Wait()
		for _, n := range res.PerConn {
			res.Bytes += n
		}
	}
	for _, c := range conns {
		c.Close()
	}
	return finish(res, start, cpu0), nil
}
