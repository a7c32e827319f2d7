package inject

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	var objs injObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return st, fmt.Errorf("load injector program (XDP live frames need Linux 5.18+): %w", err)
	}
	defer objs.Close()

	var res struct {
		st  Stats
		err error
	}
	// The whole loop runs inside the sending host's namespace: BPF_PROG_RUN resolves the
	// context's ingress ifindex in the caller's namespace.
	err = netnsutil.Do(c.Netns, func() error {
		res.st, res.err = xdpLoop(ctx, c, &objs, st)
		return nil
	})
	if err != nil {
		return st, err
	}
	return res.st, res.err
}

// xdpLoop pins the (locked) thread, paces calls of BPF_PROG_RUN and restores the thread's
// affinity before it goes back to the Go scheduler.
func xdpLoop(ctx context.Context, c Config, objs *injObjects, st Stats) (Stats, error) {
	link, err := netlink.LinkByName(c.Device)
	if err != nil {
		return st, fmt.Errorf("device %q in namespace %q: %w", c.Device, c.Netns, err)
	}
	attrs := link.Attrs()
	if attrs.Flags&(1<<0) == 0 {
		return st, fmt.Errorf("device %q in namespace %q is down", c.Device, c.Netns)
	}
	if l := c.FrameLen() - EthLen; l > attrs.MTU {
		return st, fmt.Errorf("frame of %d bytes (IP length %d) exceeds %s's MTU %d: lower payload_size", c.FrameLen(), l, c.Device, attrs.MTU)
	}
	if c.SrcMAC.IsZero() {
		copy(c.SrcMAC[:], attrs.HardwareAddr)
	}
	var orig unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		return st, fmt.Errorf("read CPU affinity: %w", err)
	}
	defer unix.SchedSetaffinity(0, &orig) //nolint:errcheck // best effort: the thread is locked by Do
	cpu := 0
	if c.CPU != nil {
		cpu = *c.CPU
	} else {
		// Per-CPU sequence counters need one CPU for the whole run: stay where we are.
		cpu = currentCPU()
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return st, fmt.Errorf("pin sender to CPU %d: %w", cpu, err)
	}
	if c.CPU != nil {
		st.CPU = cpu
	}

	frames := make([][]byte, c.Flows)
	for f := range frames {
		frames[f] = BuildFrame(c, f)
	}
	st.FrameLen, st.Flows = c.FrameLen(), c.Flows
	batch := xdpBatch(c)
	chunk := max(batch/c.Flows, 1)
	// Each BPF_PROG_RUN call sets up and tears down a page pool, and on recent kernels the
	// teardown waits for an RCU grace period (milliseconds, asleep): calls are long, so the
	// pacer may grant up to a whole call's worth of due frames at once (bursts of about
	// rate x call time; the call time is in MaxCall).
	p := pacer{rate: c.Rate, maxDebt: 200 * time.Millisecond}
	xmit0, haveXmit := xdpXmitted(c.Netns, c.Device)
	cpu0 := threadCPUTime()
	start := time.Now()
	var deadline time.Time
	if c.Duration > 0 {
		deadline = start.Add(c.Duration)
	}
	var offered uint64
	flow := 0
	var runErr error
	for {
		now := time.Now()
		if ctx.Err() != nil || (!deadline.IsZero() && !now.Before(deadline)) || (c.Count > 0 && offered >= c.Count) {
			break
		}
		want := chunk
		if c.Count > 0 {
			want = int(min(uint64(want), c.Count-offered))
		}
		n, wait := p.allow(now, want)
		if n == 0 {
			sleepUntil(ctx, now.Add(wait), deadline)
			continue
		}
		p.took(n)
		callStart := time.Now()
		_, err := objs.PrgInjectXdp.Run(&ebpf.RunOptions{
			Data:    frames[flow],
			Context: xdpMd{DataEnd: uint32(len(frames[flow])), IngressIfindex: uint32(attrs.Index)},
			Repeat:  uint32(n),
			Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		})
		callEnd := time.Now()
		st.Syscalls++
		st.MaxCall = max(st.MaxCall, callEnd.Sub(callStart))
		if err != nil && !errors.Is(err, unix.EINTR) {
			runErr = fmt.Errorf("BPF_PROG_RUN live frames on %s: %w", c.Device, err)
			st.LastError = err.Error()
			break
		}
		if offered == 0 && haveXmit {
			if x, ok := xdpXmitted(c.Netns, c.Device); ok && x == xmit0 {
				runErr = fmt.Errorf("%w: %s's peer took none of %d XDP frames: it needs NAPI (ethtool -K <peer> gro on, as the lab's underlay has) or use the packet method", ErrPeerNoXDP, c.Device, n)
				offered += uint64(n)
				break
			}
		}
		offered += uint64(n)
		flow = (flow + 1) % c.Flows
	}
	st.Duration = time.Since(start)
	st.SenderCPUNs = threadCPUTime() - cpu0
	// The program's own counters are the truth: BPF_PROG_RUN may repeat a batch after an
	// interruption, and every frame the program stamped was transmitted.
	st.Sent = sentFrames(objs.PrgInjectSeq, cpu, c.Flows)
	st.Attempted = st.Sent
	st.Bytes = st.Sent * uint64(st.FrameLen)
	if x, ok := xdpXmitted(c.Netns, c.Device); ok && haveXmit {
		st.XmitDropped = st.Sent - min(st.Sent, x-xmit0)
	}
	if st.Duration > 0 {
		st.PPS = float64(st.Sent) / st.Duration.Seconds()
	}
	if ps, err := objs.PrgInjectXdp.Stats(); err == nil {
		st.ProgRuns, st.ProgRunNs = ps.RunCount, uint64(ps.Runtime.Nanoseconds())
	}
	return st, runErr
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
