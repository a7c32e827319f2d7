package ezpath

import (
	"fmt"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// Option keys (declared on Config).
const (
	OptLab       = "lab"
	OptPolicy    = "policy"
	OptInterval  = "interval"
	OptTableSize = "table_size"
	OptClasses   = "classes"
	OptActive    = "active"
	OptIdle      = "idle"
	OptMinRate   = "min_rate"
	OptDrain     = "drain"
)

// Config is the controller's and data plane's settings.
type Config struct {
	Lab       string        `json:"lab" opt:"lab" flag:"-" help:"the lab whose ToR switches carry the offloaded flows (attach --lab sets it)"`
	Policy    string        `json:"policy" opt:"policy" default:"auto" enum:"auto,manual" help:"auto: the controller offloads hot pairs; manual: only \"peregrine ezpath offload\""`
	Interval  time.Duration `json:"interval" opt:"interval" default:"1s" range:"1ms..1m" help:"controller polling period"`
	TableSize int           `json:"table_size" opt:"table_size" default:"1024" range:"1..1048576" help:"entries of each ToR tunnel table (ezp_encap, ezp_decap): the switch SRAM"`
	Classes   string        `json:"classes,omitempty" opt:"classes" help:"priority class file, lines \"<container or IP> critical|high|normal|low|never\""`
	Active    int           `json:"active" opt:"active" default:"3" range:"1..1048576" help:"intervals a pair must be active before it is offloaded (hysteresis k)"`
	Idle      int           `json:"idle" opt:"idle" default:"5" range:"1..1048576" help:"idle intervals before an auto-offloaded pair goes back to the overlay (hysteresis m)"`
	MinRate   float64       `json:"min_rate" opt:"min_rate" default:"1048576" range:"1e-9..1e15" help:"bytes/s (both directions) for a pair to count as active"`
	Drain     time.Duration `json:"drain" opt:"drain" default:"200ms" range:"1ms..1m" help:"wait between removing the hosts' tag rules and the switch entries"`
}

var schema = option.Declare(Name, Config{})

// DefaultDrain is the drain's declared default, for `ezpath unoffload` (TestDeclaredDefaults
// keeps the two equal).
const DefaultDrain = 200 * time.Millisecond

// Complete takes the lab from attach --lab and checks the class file.
func (c *Config) Complete(o datapath.Options) error {
	if c.Lab == "" {
		c.Lab = o.Lab
	}
	if c.Lab == "" {
		return fmt.Errorf("ezpath works on a lab's ToR switches: use --lab (a lab built with `peregrine lab up --tor`)")
	}
	if c.Classes != "" {
		if _, err := LoadClasses(c.Classes); err != nil {
			return err
		}
	}
	return nil
}

// ParseConfig reads the options; every error names the option to fix.
func ParseConfig(extra map[string]string) (Config, error) {
	return configOf(datapath.Options{Extra: extra})
}

func configOf(o datapath.Options) (Config, error) { return datapath.ConfigOf[Config](Name, o) }

// Budget is how many entries of each switch table the controller may fill: a tenth of the
// table is kept free for manual offloads and churn, as a switch keeps SRAM headroom.
func (c Config) Budget() int {
	b := c.TableSize - (c.TableSize+9)/10
	if b < 1 {
		b = 1
	}
	return b
}
