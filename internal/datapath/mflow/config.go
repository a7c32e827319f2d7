package mflow

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
)

// Keys of datapath.Options.Extra that mflow reads (attach's flags, bench's "@key=value").
const (
	OptBatch       = "batch"         // packets per micro-flow
	OptElephantPPS = "elephant_pps"  // packets/s at or above which a flow is split (0 = off)
	OptElephantBPS = "elephant_bps"  // bits/s, with k/M/G suffixes (0 = off)
	OptWindow      = "window"        // rate window of the elephant test
	OptSplitAt     = "split_at"      // full-path | device
	OptMerge       = "merge"         // true: one CPU per split flow before the transport
	OptMice        = "mice"          // pass | affine
	OptQueue       = "queue_size"    // cpumap ring per splitting CPU (full-path)
	OptGuard       = "reorder_guard" // out-of-order segments per window that put a flow on hold (0 = off)
	OptGuardHold   = "reorder_hold"  // first hold, doubled per further hold up to 16x
)

// optionKeys are the Extra keys mflow takes; the splitting CPUs are attach's --cpus.
var optionKeys = []string{OptBatch, OptElephantPPS, OptElephantBPS, OptWindow, OptSplitAt, OptMerge, OptMice, OptQueue, OptGuard, OptGuardHold}

// Split points.
const (
	SplitFullPath = "full-path"
	SplitDevice   = "device"
)

// Defaults: the paper's batch 256 and 2 splitting cores. The paper does not say how elephants
// are found; 10 kpps over 20 ms (200 packets) keeps request/response and keep-alive flows out
// while any bulk transfer qualifies within one window.
const (
	DefaultBatch       = 256
	DefaultSplitCPUs   = 2
	DefaultElephantPPS = 10000
	DefaultWindow      = 20 * time.Millisecond
	// Reorder guard: 8 out-of-order TCP segments within one window put a flow on one path for
	// 500 ms (then 1 s, 2 s, ... 8 s while it keeps reordering). One batch landing late shows as
	// a handful of such segments, so a clean split stays split.
	DefaultGuard     = 8
	DefaultGuardHold = 500 * time.Millisecond
	MaxGuardHold     = time.Minute
)

// Config is mflow's settings after validation.
type Config struct {
	CPUs        []int         `json:"cpus"` // splitting CPUs, ascending
	Batch       int           `json:"batch"`
	ElephantPPS uint64        `json:"elephant_pps"`
	ElephantBPS uint64        `json:"elephant_bps"`
	Window      time.Duration `json:"window"`
	SplitAt     string        `json:"split_at"`
	Merge       bool          `json:"merge"`
	MiceAffine  bool          `json:"mice_affine"`
	QueueSize   int           `json:"queue_size"`
	// Guard is the reorder guard's threshold (out-of-order segments per window, 0 = off) and
	// GuardHold its first hold; bpf/mflow.h has the mechanism.
	Guard     int           `json:"reorder_guard"`
	GuardHold time.Duration `json:"reorder_hold"`
}

// ParseConfig reads mflow's settings; cpus are attach's --cpus (nil: the first online ones).
// Unknown keys are refused.
func ParseConfig(cpus []int, extra map[string]string, online []int) (Config, error) {
	if err := datapath.CheckOptionKeys(Name, extra); err != nil {
		return Config{}, err
	}
	c := Config{Batch: DefaultBatch, ElephantPPS: DefaultElephantPPS, Window: DefaultWindow, SplitAt: SplitFullPath,
		Guard: DefaultGuard, GuardHold: DefaultGuardHold}
	var err error
	c.CPUs = slices.Clone(cpus)
	if len(c.CPUs) == 0 {
		c.CPUs = slices.Clone(online[:min(DefaultSplitCPUs, len(online))])
	}
	slices.Sort(c.CPUs)
	if len(slices.Compact(slices.Clone(c.CPUs))) != len(c.CPUs) {
		return c, fmt.Errorf("mflow: splitting CPUs %v list a CPU twice", c.CPUs)
	}
	if len(c.CPUs) < 2 {
		return c, fmt.Errorf("mflow: %d splitting CPU(s) %v: micro-flows need at least 2 (one CPU only moves the stage: use falcon --split-cpus for that)", len(c.CPUs), c.CPUs)
	}
	if len(c.CPUs) > grosplit.MaxSplitCPUs {
		return c, fmt.Errorf("mflow: %d splitting CPUs, at most %d", len(c.CPUs), grosplit.MaxSplitCPUs)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu > grosplit.MaxCPUID {
			return c, fmt.Errorf("mflow: CPU %d out of range 0..%d", cpu, grosplit.MaxCPUID)
		}
	}
	if v, ok := extra[OptBatch]; ok {
		b, err := strconv.Atoi(v)
		switch {
		case err != nil:
			return c, fmt.Errorf("mflow: --batch %q: want a whole number of packets", v)
		case b < 1:
			return c, fmt.Errorf("mflow: --batch %d: a micro-flow holds at least 1 packet (the paper's default is %d)", b, DefaultBatch)
		case b > grosplit.MaxMFlowBatch:
			return c, fmt.Errorf("mflow: --batch %d: more than %d packets is more than any flow has in flight, so batches would never rotate (the paper's default is %d)", b, grosplit.MaxMFlowBatch, DefaultBatch)
		}
		c.Batch = b
	}
	if v, ok := extra[OptElephantPPS]; ok {
		if c.ElephantPPS, err = parseRate(v); err != nil {
			return c, fmt.Errorf("mflow: --elephant-pps %q: %w", v, err)
		}
	}
	if v, ok := extra[OptElephantBPS]; ok {
		if c.ElephantBPS, err = parseRate(v); err != nil {
			return c, fmt.Errorf("mflow: --elephant-bps %q: %w", v, err)
		}
	}
	if v, ok := extra[OptWindow]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < grosplit.MinWindow || d > grosplit.MaxWindow {
			return c, fmt.Errorf("mflow: --window %q: want a duration in %v..%v", v, grosplit.MinWindow, grosplit.MaxWindow)
		}
		c.Window = d
	}
	if v, ok := extra[OptSplitAt]; ok {
		switch v {
		case SplitFullPath, SplitDevice:
			c.SplitAt = v
		case "full", "irq":
			c.SplitAt = SplitFullPath
		default:
			return c, fmt.Errorf("mflow: --split-at %q: want full-path (IRQ split before skb allocation) or device (before the VXLAN device)", v)
		}
	}
	if v, ok := extra[OptMerge]; ok {
		if c.Merge, err = strconv.ParseBool(v); err != nil {
			return c, fmt.Errorf("mflow: --merge %q: want true or false", v)
		}
	}
	if v, ok := extra[OptMice]; ok {
		switch v {
		case "pass":
		case "affine":
			c.MiceAffine = true
		default:
			return c, fmt.Errorf("mflow: --mice %q: want pass (normal path) or affine (one splitting CPU per flow)", v)
		}
	}
	if v, ok := extra[OptGuard]; ok {
		g, err := strconv.Atoi(v)
		if err != nil || g < 0 || g > 1<<20 {
			return c, fmt.Errorf("mflow: --reorder-guard %q: want a number of out-of-order segments per window (0 turns the guard off)", v)
		}
		c.Guard = g
	}
	if v, ok := extra[OptGuardHold]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < grosplit.MinWindow || d > MaxGuardHold {
			return c, fmt.Errorf("mflow: --reorder-hold %q: want a duration in %v..%v", v, grosplit.MinWindow, MaxGuardHold)
		}
		c.GuardHold = d
	}
	if v, ok := extra[OptQueue]; ok {
		q, err := strconv.Atoi(v)
		if err != nil || q < 1 || q > grosplit.MaxQueueSize {
			return c, fmt.Errorf("mflow: --queue-size %q: want 1..%d frames", v, grosplit.MaxQueueSize)
		}
		c.QueueSize = q
	}
	return c, nil
}

// watchesPorts tells whether the merge-point program runs on the pods' host-side veths: it
// merges (--merge) and keeps the reorder guard's watch.
func (c Config) watchesPorts() bool { return c.Merge || c.Guard > 0 }

// parseRate reads "10000", "1.5M", "10G" (k, M, G are powers of 1000).
func parseRate(s string) (uint64, error) {
	mult := 1.0
	t := strings.TrimSpace(s)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult, t = 1e3, t[:n-1]
		case 'm', 'M':
			mult, t = 1e6, t[:n-1]
		case 'g', 'G':
			mult, t = 1e9, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*mult > 1e15 {
		return 0, fmt.Errorf("want a non-negative rate like 10000, 500k, 2M or 10G")
	}
	return uint64(f * mult), nil
}

// checkOverlap refuses splitting CPUs that are all IRQ CPUs: batches would be "split" onto the
// CPU(s) that already run the whole path. Overlap with some of them is allowed (on a 2-CPU
// machine it is unavoidable) and noted.
func checkOverlap(c Config, irq []int) (note string, err error) {
	if len(irq) == 0 {
		return "", nil
	}
	var shared []int
	for _, cpu := range c.CPUs {
		if slices.Contains(irq, cpu) {
			shared = append(shared, cpu)
		}
	}
	switch {
	case len(shared) == len(c.CPUs):
		return "", fmt.Errorf("mflow: every splitting CPU %v is an IRQ CPU of the underlay (%v): the batches would run where the whole path already runs; choose CPUs outside the IRQ set with --cpus", c.CPUs, irq)
	case len(shared) > 0:
		return fmt.Sprintf("mflow: splitting CPUs %v include IRQ CPU(s) %v: those batches compete with the receive interrupt work (fine on a small machine, avoid it on a big one)", c.CPUs, shared), nil
	}
	return "", nil
}
