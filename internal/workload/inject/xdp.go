package inject

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Injection methods (Config.Method).
const (
	// MethodXDP runs prg_inject_xdp through BPF_PROG_RUN in live-frame mode: the kernel
	// transmits each copy of one prebuilt frame out of Device (XDP_TX), hundreds per syscall,
	// with no socket, skb or qdisc on the sending side. Needs the device's peer to drain XDP
	// frames: a veth whose peer has GRO on (or an XDP program) does.
	MethodXDP = "xdp"
	// MethodPacket sends with AF_PACKET + sendmmsg: works on any device, costs the sender
	// roughly as much per frame as the receiver's stack.
	MethodPacket = "packet"
)

// ProgName is the injector's XDP program as bpftool shows it.
const ProgName = "prg_inject_xdp"

// Batch bounds of the XDP method: frames per BPF_PROG_RUN. Each call sets up a page pool, so
// calls carry thousands of frames.
const (
	xdpBatchMax     = 1 << 16
	xdpBatchUnpaced = 8192
)

// xdpMd is struct xdp_md, the context BPF_PROG_RUN takes for an XDP program.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// xdpBatch is the most frames one call may carry: an explicit Config.Batch, else a large
// batch unpaced, and unpaced the pacer decides (whatever fell due while the last call ran).
func xdpBatch(c Config) int {
	if c.Batch > 0 && c.Batch != DefaultBatch {
		return c.Batch
	}
	if c.Rate <= 0 {
		return xdpBatchUnpaced
	}
	return xdpBatchMax
}

// xdpWorkers is how many threads call BPF_PROG_RUN at once, all pinned to the sender's CPU.
// Each call ends by tearing down its page pool, which on recent kernels sleeps for an RCU grace
// period (tens of milliseconds on a VM); while one thread sleeps, the others inject, so the
// receiver sees a steady stream instead of bursts with idle gaps. Sleeping costs no CPU.
const xdpWorkers = 8

// runXDP is Run for MethodXDP.
func runXDP(ctx context.Context, c Config) (Stats, error) {
	st := Stats{CPU: -1, Method: MethodXDP}
	spec, err := loadInj()
	if err != nil {
		return st, fmt.Errorf("load injector program: %w", err)
	}
	if err := spec.Variables[injVarPrgInjectOff].Set(uint32(c.Headroom())); err != nil {
		return st, fmt.Errorf("configure injector program: %w", err)
	}
	// An exact count is enforced in the program too: a call interrupted by a signal is run
	// again whole (cilium/ebpf retries BPF_PROG_RUN on EINTR), which would send extra frames.
	if err := spec.Variables[injVarPrgInjectLimit].Set(c.Count); err != nil {
		return st, fmt.Errorf("configure injector program: %w", err)
	}
	var objs injObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return st, fmt.Errorf("load injector program (XDP live frames need Linux 5.18+): %w", err)
	}
	defer objs.Close()

	x, err := newXDPSender(ctx, c, &objs)
	if err != nil {
		return st, err
	}
	if c.CPU != nil {
		st.CPU = x.cpu
	}
	st.FrameLen, st.Flows = c.FrameLen(), c.Flows
	xmit0, haveXmit := xdpXmitted(c.Netns, c.Device)
	start := time.Now()
	if c.Duration > 0 {
		x.deadline = start.Add(c.Duration)
	}
	// One call first, alone: a peer that cannot take XDP frames drops them without a trace,
	// so check that it took them before going on.
	x.work(ctx, c.Netns, 1)
	if x.err == nil && haveXmit && x.offered > 0 {
		if n, ok := xdpXmitted(c.Netns, c.Device); ok && n == xmit0 {
			x.err = fmt.Errorf("%w: %s's peer took none of %d XDP frames: it needs NAPI (ethtool -K <peer> gro on, as the lab's underlay has) or use the packet method", ErrPeerNoXDP, c.Device, x.offered)
		}
	}
	if x.err == nil {
		var wg sync.WaitGroup
		for range xdpWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x.work(ctx, c.Netns, 0)
			}()
		}
		wg.Wait()
	}
	st.Duration = time.Since(start)
	st.SenderCPUNs, st.Syscalls, st.MaxCall = x.cpuNs, x.calls, x.maxCall
	if x.err != nil {
		st.LastError = x.err.Error()
	}
	// The program's own counters are the truth: BPF_PROG_RUN may repeat a batch after an
	// interruption, and every frame the program stamped was transmitted.
	st.Sent = sentFrames(objs.PrgInjectSeq, x.cpu, c.Flows)
	st.Attempted = st.Sent
	st.Bytes = st.Sent * uint64(st.FrameLen)
	if n, ok := xdpXmitted(c.Netns, c.Device); ok && haveXmit {
		st.XmitDropped = st.Sent - min(st.Sent, n-xmit0)
	}
	if st.Duration > 0 {
		st.PPS = float64(st.Sent) / st.Duration.Seconds()
	}
	if ps, err := objs.PrgInjectXdp.Stats(); err == nil {
		st.ProgRuns, st.ProgRunNs = ps.RunCount, uint64(ps.Runtime.Nanoseconds())
	}
	return st, x.err
}

// xdpSender is the state the injecting threads share.
type xdpSender struct {
	c        Config
	prog     *ebpf.Program
	frames   [][]byte
	ifindex  int
	cpu      int
	chunk    int
	deadline time.Time

	mu      sync.Mutex
	p       pacer
	offered uint64
	flow    int
	calls   uint64
	maxCall time.Duration
	cpuNs   uint64
	err     error
}

func newXDPSender(ctx context.Context, c Config, objs *injObjects) (*xdpSender, error) {
	x := &xdpSender{c: c, prog: objs.PrgInjectXdp}
	err := netnsutil.Do(c.Netns, func() error {
		link, err := netlink.LinkByName(c.Device)
		if err != nil {
			return fmt.Errorf("device %q in namespace %q: %w", c.Device, c.Netns, err)
		}
		attrs := link.Attrs()
		if attrs.Flags&(1<<0) == 0 {
			return fmt.Errorf("device %q in namespace %q is down", c.Device, c.Netns)
		}
		if l := c.FrameLen() - EthLen; l > attrs.MTU {
			return fmt.Errorf("frame of %d bytes (IP length %d) exceeds %s's MTU %d: lower payload_size", c.FrameLen(), l, c.Device, attrs.MTU)
		}
		if x.c.SrcMAC.IsZero() {
			copy(x.c.SrcMAC[:], attrs.HardwareAddr)
		}
		x.ifindex = attrs.Index
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Per-CPU sequence counters need one CPU for the whole run: the given one, else this one.
	x.cpu = currentCPU()
	if c.CPU != nil {
		x.cpu = *c.CPU
	}
	x.frames = make([][]byte, c.Flows)
	for f := range x.frames {
		x.frames[f] = BuildFrame(x.c, f)
	}
	x.chunk = max(xdpBatch(c)/c.Flows, 1)
	// Calls are long (see xdpWorkers), so the pacer may grant a whole call's worth of due
	// frames at once.
	x.p = pacer{rate: c.Rate, maxDebt: 5 * time.Millisecond}
	return x, nil
}

// work injects from a thread in the sending namespace, pinned to the sender's CPU (its
// affinity restored before the thread goes back to Go's scheduler), until the run ends, or
// for at most maxCalls calls when that is not 0.
func (x *xdpSender) work(ctx context.Context, netns string, maxCalls int) {
	err := netnsutil.Do(netns, func() error {
		var orig, set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			return fmt.Errorf("read CPU affinity: %w", err)
		}
		set.Set(x.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pin sender to CPU %d: %w", x.cpu, err)
		}
		defer unix.SchedSetaffinity(0, &orig) //nolint:errcheck // best effort; Do keeps a thread it cannot restore
		cpu0 := threadCPUTime()
		defer func() {
			d := threadCPUTime() - cpu0
			x.mu.Lock()
			x.cpuNs += d
			x.mu.Unlock()
		}()
		busy := 0 // consecutive calls refused for lack of room
		for calls := 0; maxCalls == 0 || calls < maxCalls; calls++ {
			n, flow, ok := x.next(ctx)
			if !ok {
				return nil
			}
			t0 := time.Now()
			_, err := x.prog.Run(&ebpf.RunOptions{
				Data:    x.frames[flow],
				Context: xdpMd{DataEnd: uint32(len(x.frames[flow])), IngressIfindex: uint32(x.ifindex)},
				Repeat:  uint32(n),
				Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			})
			d := time.Since(t0)
			x.mu.Lock()
			x.calls++
			x.maxCall = max(x.maxCall, d)
			x.mu.Unlock()
			switch {
			case err == nil || errors.Is(err, unix.EINTR):
				busy = 0
			case (transient(err) || errors.Is(err, unix.ENOSPC)) && busy < maxBusyCalls:
				// The live-frame run could not get a page or a ring slot right now (the
				// receiver is saturated, or the CPU is contended): the claimed frames stay
				// counted as offered (the sink reports what is missing as loss), back off.
				busy++
				time.Sleep(busyBackoff)
			default:
				return fmt.Errorf("BPF_PROG_RUN live frames on %s: %w", x.c.Device, err)
			}
		}
		return nil
	})
	if err != nil {
		x.mu.Lock()
		if x.err == nil {
			x.err = err
		}
		x.mu.Unlock()
	}
}

// A live-frame run refused for lack of room (ENOSPC, ENOMEM, ENOBUFS...) is retried after
// busyBackoff; maxBusyCalls refusals in a row (about a second) end the run with the error.
const (
	busyBackoff  = 200 * time.Microsecond
	maxBusyCalls = 5000
)

// next waits until frames are due and claims them: how many, of which flow. ok is false when
// the run is over (deadline, count, cancellation or another thread's error).
func (x *xdpSender) next(ctx context.Context) (n, flow int, ok bool) {
	for {
		x.mu.Lock()
		now := time.Now()
		c := x.c
		if x.err != nil || ctx.Err() != nil || (!x.deadline.IsZero() && !now.Before(x.deadline)) || (c.Count > 0 && x.offered >= c.Count) {
			x.mu.Unlock()
			return 0, 0, false
		}
		want := x.chunk
		if c.Count > 0 {
			want = int(min(uint64(want), c.Count-x.offered))
		}
		n, wait := x.p.allow(now, want)
		if n > 0 {
			x.p.took(n)
			x.offered += uint64(n)
			flow = x.flow
			x.flow = (x.flow + 1) % len(x.frames)
			x.mu.Unlock()
			return n, flow, true
		}
		x.mu.Unlock()
		sleepUntil(ctx, now.Add(wait), x.deadline)
	}
}

// sentFrames sums the per-flow sequence counters of one CPU.
func sentFrames(m *ebpf.Map, cpu, flows int) uint64 {
	var total uint64
	for f := range flows {
		var vals []uint64
		if err := m.Lookup(uint32(f), &vals); err == nil && cpu < len(vals) {
			total += vals[cpu]
		}
	}
	return total
}

// ErrPeerNoXDP means the device's peer cannot take XDP frames (a veth peer without NAPI).
var ErrPeerNoXDP = errors.New("XDP frames not taken")

// xdpXmitted is the count of XDP frames the device handed its peer (a veth's ethtool
// tx_queue_N_xdp_xmit, summed over queues); false when the device has no such counter. Frames a
// veth peer without NAPI refuses are dropped without any counter, so this is how to see them.
func xdpXmitted(netns, dev string) (uint64, bool) {
	out, err := netnsutil.Run(context.Background(), netns, "ethtool", "-S", dev)
	if err != nil {
		return 0, false
	}
	var total uint64
	found := false
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(k, "tx_queue_") || !strings.HasSuffix(k, "_xdp_xmit") {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			total += n
			found = true
		}
	}
	return total, found
}

// threadCPUTime is the calling thread's user+system CPU time in nanoseconds.
func threadCPUTime() uint64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return uint64(ru.Utime.Nano() + ru.Stime.Nano())
}

// currentCPU is the CPU the calling thread runs on now (getcpu(2)).
func currentCPU() int {
	var c, node uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&node)), 0); e != 0 {
		return 0
	}
	return int(c)
}
