package falcon

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// Option keys (declared on Config; exported for tests and callers that build options).
const (
	OptThreshold = "threshold"
	OptStatic    = "static"
	OptInterval  = "interval"
	OptRepick    = "repick"
	OptSplitCPUs = "split_cpus"
	OptSplit     = "split"
	OptLoad      = "load"
)

// Defaults (the declaration on Config is what the CLI and the docs show). The paper's prototype
// updates its loads every 10 jiffies (10-40 ms at HZ 1000-250) and found thresholds of 80-90 %
// best. On a stock kernel a softirq runs ahead of application code, so application time is
// room for packet stages (see probe.LoadKernel): the default signal is kernel.
const (
	DefaultRepick = 200 * time.Millisecond
	// ewmaAlpha is the prototype's load = (4*load + busy)/5.
	ewmaAlpha = 0.2
)

// Config is falcon's settings: the declared options, and what Complete derives from them and
// from attach's --cpus (saved in the record as JSON).
type Config struct {
	Threshold int              `json:"threshold" opt:"threshold" default:"80" range:"0..100" help:"load threshold in percent: at or above it on average the gate closes, per CPU it rejects a first choice"`
	Static    bool             `json:"static" opt:"static" help:"first choice only (the paper's \"static\"); default is two-choice (\"dynamic\")"`
	Interval  time.Duration    `json:"interval" opt:"interval" default:"20ms" range:"1ms..10s" help:"load monitor period"`
	Repick    time.Duration    `json:"repick" opt:"repick" default:"200ms" range:"1ms..1h" help:"idle time after which a flow's CPU choice may be re-picked"`
	SplitCPUs []int            `json:"split_cpus,omitempty" opt:"split_cpus" help:"GRO split CPUs (XDP + cpumap on the underlay), e.g. 1"`
	Split     string           `json:"split" opt:"split" enum:"off,on,auto" help:"GRO split; default on when split_cpus is given, else off. auto: the node agent attaches the split while the NIC core saturates and detaches it once it cools"`
	Load      probe.LoadSignal `json:"load,omitempty" opt:"load" default:"kernel" enum:"kernel,busy" help:"what counts as a CPU's load: kernel (system+irq+softirq+steal; application time is room for packet stages) or busy (all non-idle time, the paper's prototype)"`

	CPUs      []int `json:"cpus"`       // the FALCON set (attach's --cpus, default all online), ascending
	TwoChoice bool  `json:"two_choice"` // !Static
}

var schema = option.Declare(Name, Config{})

// Complete takes the FALCON set from --cpus and checks it and the split against the machine.
func (c *Config) Complete(o datapath.Options) error {
	c.TwoChoice = !c.Static
	c.CPUs = slices.Clone(o.CPUs)
	if len(c.CPUs) == 0 {
		for i := 0; i < runtime.NumCPU(); i++ {
			c.CPUs = append(c.CPUs, i)
		}
	}
	slices.Sort(c.CPUs)
	c.CPUs = slices.Compact(c.CPUs)
	if len(c.CPUs) > MaxCPUs {
		return fmt.Errorf("%d CPUs in the set; at most %d", len(c.CPUs), MaxCPUs)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= MaxCPUID {
			return fmt.Errorf("CPU %d is out of range 0..%d", cpu, MaxCPUID-1)
		}
	}
	if err := cpuset.CheckOnline(c.CPUs); err != nil {
		return fmt.Errorf("--cpus: %w", err)
	}
	if err := cpuset.CheckOnline(c.SplitCPUs); err != nil {
		return fmt.Errorf("--split-cpus: %w", err)
	}
	if c.Split == "" {
		c.Split = "off"
		if len(c.SplitCPUs) > 0 {
			c.Split = "on" // naming split CPUs asks for the split
		}
	}
	if c.Split != "off" && len(c.SplitCPUs) == 0 {
		return fmt.Errorf("--split %s needs --split-cpus", c.Split)
	}
	return nil
}

// ParseConfig reads falcon's settings from attach options (cpus: attach's --cpus).
func ParseConfig(cpus []int, extra map[string]string) (Config, error) {
	return datapath.ConfigOf[Config](Name, datapath.Options{CPUs: cpus, Extra: extra})
}

// loadSignal is the configured signal; a record from before the option reads as busy.
func (c Config) loadSignal() probe.LoadSignal {
	if c.Load == "" {
		return probe.LoadBusy
	}
	return c.Load
}

// ConfigOfState is the config saved in a recorded attachment.
func ConfigOfState(st *datapath.State) (Config, error) {
	var c Config
	return c, datapath.RecordedConfig(st, &c)
}

func configOf(o datapath.Options) (Config, error) { return datapath.ConfigOf[Config](Name, o) }
