package cli

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath/ezpath"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// ezpathFlags are attach's EZPath options (--interval is shared with falcon's flag).
type ezpathFlags struct {
	policy, classes string
	tableSize       int
	active, idle    int
	minRate         float64
	drain           time.Duration
}

func (f *ezpathFlags) add(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.policy, "policy", "auto", "ezpath: auto (the controller offloads hot pairs) or manual (only \"peregrine ezpath offload\")")
	fl.IntVar(&f.tableSize, "table-size", ezpath.DefaultTableSize, "ezpath: entries of each ToR tunnel table (ezp_encap, ezp_decap): the switch SRAM")
	fl.StringVar(&f.classes, "classes", "", "ezpath: priority class file, lines \"<container or IP> critical|high|normal|low|never\"")
	fl.IntVar(&f.active, "active", ezpath.DefaultActive, "ezpath: intervals a pair must be active before it is offloaded (hysteresis k)")
	fl.IntVar(&f.idle, "idle", ezpath.DefaultIdle, "ezpath: idle intervals before an auto-offloaded pair goes back to the overlay (hysteresis m)")
	fl.Float64Var(&f.minRate, "min-rate", ezpath.DefaultMinRate, "ezpath: bytes/s (both directions) for a pair to count as active")
	fl.DurationVar(&f.drain, "drain", ezpath.DefaultDrain, "ezpath: wait between removing the hosts' tag rules and the switch entries")
}

// extra puts the flags given into the mode's options; they are an error on other modes.
func (f *ezpathFlags) extra(c *cobra.Command, mode string, tf *targetFlags, m map[string]string) error {
	keys := map[string]string{"policy": ezpath.OptPolicy, "table-size": ezpath.OptTableSize, "classes": ezpath.OptClasses,
		"active": ezpath.OptActive, "idle": ezpath.OptIdle, "min-rate": ezpath.OptMinRate, "drain": ezpath.OptDrain}
	for flag, key := range keys {
		fl := c.Flags().Lookup(flag)
		if !fl.Changed {
			continue
		}
		if mode != ezpath.Name {
			return fmt.Errorf("--%s is an ezpath flag; mode %s does not take it", flag, mode)
		}
		m[key] = fl.Value.String()
	}
	if mode != ezpath.Name {
		return nil
	}
	if fl := c.Flags().Lookup("interval"); fl != nil && fl.Changed {
		m[ezpath.OptInterval] = fl.Value.String()
	}
	if tf.useLab {
		m[ezpath.OptLab] = tf.labName
	}
	_, err := ezpath.ParseConfig(m)
	return err
}

func newEzpathCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ezpath",
		Short: "EZPath: move container pairs between the overlay and the ToR switch path, list flows",
		Long: `EZPath (seed 003) offloads selected container flows to the top-of-rack switches of a lab built
with "lab up --tor": the hosts only push or pop an 802.1Q tag (VID = tenant on the link) and the
switches do the VXLAN encapsulation. "attach ezpath --lab" loads the switch and host programs and
starts the controller (policy auto offloads hot pairs by itself); these commands change or show
what runs where. Offload always writes both switches' entries before the hosts tag; un-offload
removes the hosts' rules first, waits --drain, then the switch entries.

Tenants ("lab up --tor --tenants 2"): tenant t is VID 100+t-1 on every host-ToR link and VNI
vni+t-1 between the switches (ezp_vlan_to_vni maps (port, VID) to it; ezp_encap and ezp_decap are
keyed by VNI), each tenant's overlay namespace has its own relay (ezp0; host end ezp0-t<t>). The
tenants use the same overlay addresses, so name containers (h1-t2-c1), not addresses: an address
is ambiguous there, and a pair must be of one tenant.`,
		Example: `  sudo peregrine lab up --tor --containers 2
  sudo peregrine attach ezpath --lab --policy manual
  sudo peregrine ezpath offload --lab h1-c1 h2-c1
  sudo peregrine ezpath flows
  sudo peregrine ezpath unoffload --lab 198.19.1.2 198.19.2.2
  sudo peregrine detach --lab
  sudo peregrine lab up --tor --tenants 2 --name tn     # tenant 2: h1-t2-c1, h2-t2-c1 (same addresses)
  sudo peregrine attach ezpath --lab --name tn --policy manual
  sudo peregrine ezpath offload --lab --name tn h1-t2-c1 h2-t2-c1`,
	}
	c.AddCommand(newEzpathOffloadCmd(true), newEzpathOffloadCmd(false), newEzpathFlowsCmd())
	return c
}

func newEzpathOffloadCmd(on bool) *cobra.Command {
	var name string
	var useLab bool
	var drain time.Duration
	use, short := "offload", "Offload a container pair (both directions) to the switch path: both ToRs first, then both hosts"
	if !on {
		use, short = "unoffload", "Move a pair back to the overlay: both hosts' tag rules, a drain interval, then the ToR entries"
	}
	c := &cobra.Command{
		Use: use + " --lab SRC DST",
		Long: short + `.

SRC and DST are container names as "lab status" shows them (h1-c1, h1-t2-c1), or overlay IPs in a
lab with one tenant (with tenants every address belongs to each tenant: names only).`,
		Short: short,
		Example: fmt.Sprintf(`  sudo peregrine ezpath %s --lab h1-c1 h2-c1
  sudo peregrine ezpath %s --lab --name tr 198.19.1.2 198.19.2.2   # one tenant: addresses name containers
  sudo peregrine ezpath %s --lab --name tn h1-t2-c1 h2-t2-c1       # tenants: names only`, use, use, use),
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !useLab {
				return fmt.Errorf("ezpath works on a lab's switches: add --lab (and --name if the lab is not %q)", lab.DefaultName)
			}
			var err error
			if on {
				err = ezpath.Offload(name, args[0], args[1], "manual")
			} else {
				err = ezpath.Unoffload(name, args[0], args[1], drain)
			}
			if err != nil {
				return err
			}
			state := "offloaded to the switch path"
			if !on {
				state = "back on the overlay"
			}
			fmt.Printf("%s <-> %s %s\n", args[0], args[1], state)
			return nil
		},
	}
	c.Flags().BoolVar(&useLab, "lab", false, "work on a lab (see --name)")
	c.Flags().StringVar(&name, "name", lab.DefaultName, "the lab's name")
	if !on {
		c.Flags().DurationVar(&drain, "drain", ezpath.DefaultDrain, "wait between removing the hosts' rules and the switch entries")
	}
	return c
}

func newEzpathFlowsCmd() *cobra.Command {
	var name string
	var asJSON bool
	c := &cobra.Command{
		Use:   "flows",
		Short: "List the overlay flows the ToR switches count: rate, state (offloaded or overlay) and path",
		Example: `  sudo peregrine ezpath flows
  sudo peregrine ezpath flows --name tr --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			views, err := ezpath.Flows(name, time.Second)
			if err != nil {
				return err
			}
			led, err := ezpath.ReadLedger(name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(os.Stdout, map[string]any{"flows": views, "pairs": led.Pairs, "refused": led.Refused})
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "FLOW\tSRC\tDST\tRATE\tSTATE\tWHERE\tCLASS\tNOTE")
			for _, v := range views {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Key, v.Src, v.Dst, rateText(v.Rate), v.State, v.Where, v.Class, v.Note)
			}
			tw.Flush()
			if len(views) == 0 {
				fmt.Println("no overlay traffic counted by the switches yet")
			}
			for _, p := range led.Pairs {
				fmt.Printf("offloaded: %s <-> %s (%s, since %s)\n", p.A, p.B, p.By, p.Since.Format("15:04:05"))
			}
			for _, p := range led.Refused {
				fmt.Printf("refused:   %s <-> %s: %s\n", p.A, p.B, p.Note)
			}
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", lab.DefaultName, "the lab's name")
	c.Flags().BoolVar(&asJSON, "json", false, "JSON for machines")
	return c
}

func rateText(bps float64) string {
	bits := bps * 8
	switch {
	case bits >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bits/1e9)
	case bits >= 1e6:
		return fmt.Sprintf("%.1f Mbit/s", bits/1e6)
	case bits >= 1e3:
		return fmt.Sprintf("%.1f kbit/s", bits/1e3)
	}
	return strings.TrimSpace(fmt.Sprintf("%.0f bit/s", bits))
}
