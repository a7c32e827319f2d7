package mflow

import (
	"fmt"
	"slices"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// Option keys (declared on Config).
const (
	OptBatch       = "batch"
	OptElephantPPS = "elephant_pps"
	OptElephantBPS = "elephant_bps"
	OptWindow      = "window"
	OptSplitAt     = "split_at"
	OptMerge       = "merge"
	OptMice        = "mice"
	OptQueue       = "queue_size"
	OptGuard       = "reorder_guard"
	OptGuardHold   = "reorder_hold"
)

// Split points.
const (
	SplitFullPath = "full-path"
	SplitDevice   = "device"
)

// Defaults: the paper's batch 256 and 2 splitting cores. The paper does not say how elephants
// are found; 10 kpps over 20 ms (200 packets) keeps request/response and keep-alive flows out
// while any bulk transfer qualifies within one window. Reorder guard: 8 out-of-order TCP
// segments within one window put a flow on one path for 500 ms (then 1 s, 2 s, ... 8 s while it
// keeps reordering); one batch landing late shows as a handful of such segments, so a clean
// split stays split. The declaration on Config is what the CLI and the docs show.
const (
	DefaultBatch       = 256
	DefaultSplitCPUs   = 2
	DefaultElephantPPS = 10000
	DefaultGuard       = 8
	DefaultGuardHold   = 500 * time.Millisecond
)

// Config is mflow's settings: the declared options and the splitting CPUs (attach's --cpus).
type Config struct {
	Batch       int           `json:"batch" opt:"batch" default:"256" help:"packets per micro-flow (batch), 1..65536; the splitting CPUs are attach's --cpus (default: the first 2 online)"`
	ElephantPPS uint64        `json:"elephant_pps" opt:"elephant_pps" kind:"rate" default:"10000" help:"split flows at or above this packet rate, e.g. 10000 or 50k (0 = no packet-rate test)"`
	ElephantBPS uint64        `json:"elephant_bps" opt:"elephant_bps" kind:"rate" default:"0" help:"split flows at or above this bit rate, e.g. 500M (0 = no bit-rate test; both 0 = split every flow)"`
	Window      time.Duration `json:"window" opt:"window" default:"20ms" range:"1ms..10s" help:"rate window of the elephant test"`
	SplitAt     string        `json:"split_at" opt:"split_at" default:"full-path" enum:"full-path,device" alias:"full=full-path,irq=full-path" help:"full-path: IRQ split with XDP before skb allocation; device: before the VXLAN device (tcx + RPS)"`
	Merge       bool          `json:"merge" opt:"merge" help:"run the transport of each split flow on ONE CPU (container veth RPS); narrows, does not remove, reordering"`
	Mice        string        `json:"mice" opt:"mice" default:"pass" enum:"pass,affine" help:"flows below the threshold: pass (normal path) or affine (one splitting CPU per flow)"`
	QueueSize   int           `json:"queue_size" opt:"queue_size" range:"1..16384" help:"cpumap ring per splitting CPU in frames (full-path; default 2048)"`
	// Guard is the reorder guard's threshold (out-of-order segments per window, 0 = off) and
	// GuardHold its first hold; bpf/mflow.h has the mechanism.
	Guard     int           `json:"reorder_guard" opt:"reorder_guard" default:"8" range:"0..1048576" help:"this many out-of-order TCP segments of a split flow within one window, seen where the flow enters the pod, put the flow back on one path for reorder_hold (0 = off)"`
	GuardHold time.Duration `json:"reorder_hold" opt:"reorder_hold" default:"500ms" range:"1ms..1m" help:"how long the reorder guard holds a flow on one path the first time; each further hold doubles it, up to 16x"`

	CPUs       []int `json:"cpus"`        // splitting CPUs, ascending
	MiceAffine bool  `json:"mice_affine"` // Mice == "affine"
}

var schema = option.Declare(Name, Config{})

// Validate explains the batch's bounds (a bare range would not say why).
func (c *Config) Validate() error {
	switch {
	case c.Batch < 1:
		return fmt.Errorf("--batch %d: a micro-flow holds at least 1 packet (the paper's default is %d)", c.Batch, DefaultBatch)
	case c.Batch > grosplit.MaxMFlowBatch:
		return fmt.Errorf("--batch %d: more than %d packets is more than any flow has in flight, so batches would never rotate (the paper's default is %d)", c.Batch, grosplit.MaxMFlowBatch, DefaultBatch)
	}
	return nil
}

// Complete takes the splitting CPUs from --cpus (default: the first online ones).
func (c *Config) Complete(o datapath.Options) error {
	online, err := cpuset.Online()
	if err != nil {
		return err
	}
	if err := c.complete(o.CPUs, online); err != nil {
		return err
	}
	if err := cpuset.CheckOnline(c.CPUs); err != nil {
		return fmt.Errorf("splitting CPUs: %w", err)
	}
	return nil
}

func (c *Config) complete(cpus, online []int) error {
	c.MiceAffine = c.Mice == "affine"
	c.CPUs = slices.Clone(cpus)
	if len(c.CPUs) == 0 {
		c.CPUs = slices.Clone(online[:min(DefaultSplitCPUs, len(online))])
	}
	slices.Sort(c.CPUs)
	if len(slices.Compact(slices.Clone(c.CPUs))) != len(c.CPUs) {
		return fmt.Errorf("splitting CPUs %v list a CPU twice", c.CPUs)
	}
	if len(c.CPUs) < 2 {
		return fmt.Errorf("%d splitting CPU(s) %v: micro-flows need at least 2 (one CPU only moves the stage: use falcon --split-cpus for that)", len(c.CPUs), c.CPUs)
	}
	if len(c.CPUs) > grosplit.MaxSplitCPUs {
		return fmt.Errorf("%d splitting CPUs, at most %d", len(c.CPUs), grosplit.MaxSplitCPUs)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu > grosplit.MaxCPUID {
			return fmt.Errorf("CPU %d out of range 0..%d", cpu, grosplit.MaxCPUID)
		}
	}
	return nil
}

// ParseConfig reads mflow's settings against a given set of online CPUs (tests); cpus are
// attach's --cpus (nil: the first online ones).
func ParseConfig(cpus []int, extra map[string]string, online []int) (Config, error) {
	if err := datapath.CheckOptions(Name, extra); err != nil {
		return Config{}, err
	}
	ptr, err := schema.Parse(extra)
	if err != nil {
		return Config{}, err
	}
	c := ptr.(*Config)
	if err := c.complete(cpus, online); err != nil {
		return *c, fmt.Errorf("mflow: %w", err)
	}
	return *c, nil
}

// watchesPorts tells whether the merge-point program runs on the pods' host-side veths: it
// merges (--merge) and keeps the reorder guard's watch.
func (c Config) watchesPorts() bool { return c.Merge || c.Guard > 0 }

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
