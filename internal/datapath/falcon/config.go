package falcon

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// Keys of datapath.Options.Extra that falcon reads (the CLI's flags fill them). They are saved
// with the attachment record, so the agent reads the same settings.
const (
	OptThreshold = "threshold"  // busy percent, 0..100 (default 80)
	OptStatic    = "static"     // "true": first choice only (the paper's "static")
	OptInterval  = "interval"   // load monitor period, e.g. 20ms
	OptRepick    = "repick"     // idle time after which a flow's choice may be re-picked
	OptSplitCPUs = "split_cpus" // GRO split CPUs (grosplit), CPU list
	OptSplit     = "split"      // auto|on|off
	OptLoad      = "load"       // load signal: kernel (default) or busy (the prototype's)
)

// optionKeys are the Extra keys falcon takes.
var optionKeys = []string{OptThreshold, OptStatic, OptInterval, OptRepick, OptSplitCPUs, OptSplit, OptLoad}

// Defaults. The paper's prototype updates its loads every 10 jiffies (10-40 ms at HZ 1000-250)
// and found thresholds of 80-90 % best.
const (
	DefaultThreshold = 80
	DefaultInterval  = 20 * time.Millisecond
	DefaultRepick    = 200 * time.Millisecond
	// DefaultLoad: on a stock kernel a softirq runs ahead of application code, so application
	// time is room for packet stages (see probe.LoadKernel).
	DefaultLoad = probe.LoadKernel
	// ewmaAlpha is the prototype's load = (4*load + busy)/5.
	ewmaAlpha = 0.2
)

// Config is falcon's settings after validation (saved in the record as JSON).
type Config struct {
	CPUs      []int         `json:"cpus"` // the FALCON set, ascending
	Threshold int           `json:"threshold"`
	TwoChoice bool          `json:"two_choice"`
	Interval  time.Duration `json:"interval"`
	Repick    time.Duration `json:"repick"`
	SplitCPUs []int         `json:"split_cpus,omitempty"`
	Split     string        `json:"split"` // off, on, auto
	// Load is the load signal (probe.LoadSignal); empty in records written before it existed,
	// which read as the prototype's busy share.
	Load probe.LoadSignal `json:"load,omitempty"`
}

// ParseConfig reads falcon's settings from attach options; unknown keys are refused.
func ParseConfig(cpus []int, extra map[string]string) (Config, error) {
	if err := datapath.CheckOptionKeys(Name, extra); err != nil {
		return Config{}, err
	}
	c := Config{Threshold: DefaultThreshold, TwoChoice: true, Interval: DefaultInterval, Repick: DefaultRepick, Split: "off", Load: DefaultLoad}
	c.CPUs = slices.Clone(cpus)
	if len(c.CPUs) == 0 {
		for i := 0; i < runtime.NumCPU(); i++ {
			c.CPUs = append(c.CPUs, i)
		}
	}
	slices.Sort(c.CPUs)
	c.CPUs = slices.Compact(c.CPUs)
	if len(c.CPUs) > MaxCPUs {
		return c, fmt.Errorf("falcon: %d CPUs in the set; at most %d", len(c.CPUs), MaxCPUs)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= MaxCPUID {
			return c, fmt.Errorf("falcon: CPU %d is out of range 0..%d", cpu, MaxCPUID-1)
		}
	}
	if err := cpuset.CheckOnline(c.CPUs); err != nil {
		return c, fmt.Errorf("falcon: --cpus: %w", err)
	}
	if v, ok := extra[OptThreshold]; ok {
		t, err := strconv.Atoi(strings.TrimSuffix(v, "%"))
		if err != nil || t < 0 || t > 100 {
			return c, fmt.Errorf("falcon: --threshold %q: want a whole percentage in 0..100", v)
		}
		c.Threshold = t
	}
	if v, ok := extra[OptStatic]; ok {
		s, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("falcon: --static %q: want true or false", v)
		}
		c.TwoChoice = !s
	}
	var err error
	if v, ok := extra[OptLoad]; ok {
		if c.Load, err = probe.ParseLoadSignal(v); err != nil {
			return c, fmt.Errorf("falcon: --load: %w", err)
		}
	}
	if c.Interval, err = duration(extra, OptInterval, DefaultInterval, time.Millisecond, 10*time.Second); err != nil {
		return c, err
	}
	if c.Repick, err = duration(extra, OptRepick, DefaultRepick, time.Millisecond, time.Hour); err != nil {
		return c, err
	}
	if v, ok := extra[OptSplit]; ok {
		switch v {
		case "off", "on", "auto":
			c.Split = v
		default:
			return c, fmt.Errorf("falcon: --split %q: want auto, on or off", v)
		}
	}
	if v := extra[OptSplitCPUs]; v != "" {
		if c.SplitCPUs, err = cpuset.Parse(v); err != nil {
			return c, fmt.Errorf("falcon: --split-cpus: %w", err)
		}
		if err := cpuset.CheckOnline(c.SplitCPUs); err != nil {
			return c, fmt.Errorf("falcon: --split-cpus: %w", err)
		}
		if c.Split == "off" && extra[OptSplit] == "" {
			c.Split = "on" // naming split CPUs asks for the split
		}
	}
	if c.Split != "off" && len(c.SplitCPUs) == 0 {
		return c, fmt.Errorf("falcon: --split %s needs --split-cpus", c.Split)
	}
	return c, nil
}

// loadSignal is the configured signal; a record from before the option reads as busy.
func (c Config) loadSignal() probe.LoadSignal {
	if c.Load == "" {
		return probe.LoadBusy
	}
	return c.Load
}

func duration(extra map[string]string, key string, def, lo, hi time.Duration) (time.Duration, error) {
	v, ok := extra[key]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		return 0, fmt.Errorf("falcon: --%s %q: want a duration in %v..%v", key, v, lo, hi)
	}
	return d, nil
}

// ConfigOfState is the config saved in a recorded attachment.
func ConfigOfState(st *datapath.State) (Config, error) {
	var c Config
	return c, datapath.RecordedConfig(st, &c)
}

func configOf(o datapath.Options) (Config, error) { return ParseConfig(o.CPUs, o.Extra) }
