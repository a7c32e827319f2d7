package ezpath

import (
	"fmt"
	"strconv"
	"time"
)

// Keys of datapath.Options.Extra that ezpath reads (the CLI's flags fill them).
const (
	OptLab       = "lab"
	OptPolicy    = "policy"     // auto | manual
	OptInterval  = "interval"   // controller polling period
	OptTableSize = "table_size" // max_entries of ezp_encap / ezp_decap
	OptClasses   = "classes"    // priority class file
	OptActive    = "active"     // intervals a pair must be active before it is offloaded (k)
	OptIdle      = "idle"       // idle intervals before an auto-offloaded pair goes back (m)
	OptMinRate   = "min_rate"   // bytes/s for a pair to count as active
	OptDrain     = "drain"      // wait between removing host rules and switch entries
)

// Config is the controller's and data plane's settings.
type Config struct {
	Lab       string        `json:"lab"`
	Policy    string        `json:"policy"`
	Interval  time.Duration `json:"interval"`
	TableSize int           `json:"table_size"`
	Classes   string        `json:"classes,omitempty"`
	Active    int           `json:"active"`
	Idle      int           `json:"idle"`
	MinRate   float64       `json:"min_rate"`
	Drain     time.Duration `json:"drain"`
}

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultActive   = 3
	DefaultIdle     = 5
	DefaultMinRate  = 1 << 20 // 1 MiB/s
	DefaultDrain    = 200 * time.Millisecond
)

// ParseConfig reads the options; every error names the flag to fix.
func ParseConfig(extra map[string]string) (Config, error) {
	c := Config{Lab: extra[OptLab], Policy: "auto", Interval: DefaultInterval, TableSize: DefaultTableSize,
		Classes: extra[OptClasses], Active: DefaultActive, Idle: DefaultIdle, MinRate: DefaultMinRate, Drain: DefaultDrain}
	if c.Lab == "" {
		return c, fmt.Errorf("ezpath works on a lab's ToR switches: use --lab (a lab built with `peregrine lab up --tor`)")
	}
	if v := extra[OptPolicy]; v != "" {
		if v != "auto" && v != "manual" {
			return c, fmt.Errorf("--policy %q: choose auto or manual", v)
		}
		c.Policy = v
	}
	durs := map[string]*time.Duration{OptInterval: &c.Interval, OptDrain: &c.Drain}
	for k, p := range durs {
		if v := extra[k]; v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > time.Minute {
				return c, fmt.Errorf("--%s %q: need a duration between 1ms and 1m, e.g. 1s", k, v)
			}
			*p = d
		}
	}
	ints := map[string]*int{OptTableSize: &c.TableSize, OptActive: &c.Active, OptIdle: &c.Idle}
	for k, p := range ints {
		if v := extra[k]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<20 {
				return c, fmt.Errorf("--%s %q: need a whole number from 1 to 1048576", flagName(k), v)
			}
			*p = n
		}
	}
	if v := extra[OptMinRate]; v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return c, fmt.Errorf("--min-rate %q: need bytes per second above 0", v)
		}
		c.MinRate = f
	}
	if c.Classes != "" {
		if _, err := LoadClasses(c.Classes); err != nil {
			return c, err
		}
	}
	return c, nil
}

func flagName(k string) string {
	if k == OptTableSize {
		return "table-size"
	}
	return k
}

// Budget is how many entries of each switch table the controller may fill: a tenth of the
// table is kept free for manual offloads and churn, as a switch keeps SRAM headroom.
func (c Config) Budget() int {
	b := c.TableSize - (c.TableSize+9)/10
	if b < 1 {
		b = 1
	}
	return b
}
