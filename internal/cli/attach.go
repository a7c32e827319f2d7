package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// newAttachCmd is `attach MODE`: one subcommand per registered mode, whose flags are the
// mode's declared options (datapath/option) beside the framework's own.
func newAttachCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "attach MODE",
		Short: "Attach a datapath mode to this node's overlay (or to lab hosts)",
		Long: `Attach discovers the overlay behind a host network namespace (VXLAN devices, the underlay
NIC behind them, the bridges and both ends of every container veth), records every knob it
will change with its current value, then applies the mode. "peregrine detach" restores the
record exactly, also from a new process after a crash.

Modes:
` + modeList() + `
Each mode's flags are its declared options: "peregrine attach MODE --help" lists them with their
defaults, "peregrine options MODE" prints them as a table or JSON. In a lab built with --rx-cpus,
the underlay's receive mask stands in for the NIC's IRQ affinity and is left alone.`,
		Example: `  sudo peregrine attach MODE --lab              # every host of the lab "lab"
  sudo peregrine attach MODE                    # this node (the current namespace)
  sudo peregrine attach MODE --netns prg-lab-h2 --cpus 1
  sudo peregrine attach MODE --underlay ens5    # when discovery cannot tell the NIC`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("attach needs a mode: one of %s", strings.Join(datapath.ModeNames(), ", "))
			}
			_, err := datapath.Lookup(args[0])
			return err
		},
	}
	for _, m := range datapath.Modes() {
		c.AddCommand(newAttachModeCmd(m))
	}
	return c
}

func newAttachModeCmd(m datapath.Mode) *cobra.Command {
	var tf targetFlags
	var o datapath.Options
	var cpus string
	var asJSON bool
	c := &cobra.Command{
		Use:   m.Name(),
		Short: m.Summary(),
		Long: m.Summary() + `.

The flags below the common ones are the mode's declared options; docs/modes/` + m.Name() + `.md
explains them.`,
		Args: cobra.NoArgs,
	}
	if e, ok := m.(datapath.Exampler); ok {
		c.Example = e.Example()
	}
	tf.add(c)
	c.Flags().StringVar(&o.Underlay, "underlay", "", "underlay NIC, when discovery cannot tell it")
	c.Flags().StringVar(&cpus, "cpus", "", "CPUs the mode may use, e.g. 0-3 (default: all online CPUs)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the attachment records as JSON")
	given := func() map[string]string { return map[string]string{} }
	if s := m.Options(); s != nil {
		given = s.Bind(c.Flags())
	}
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		if cpus != "" {
			list, err := parseCPUList(cpus)
			if err != nil {
				return fmt.Errorf("--cpus: %w", err)
			}
			o.CPUs = list
		}
		o.Extra = given()
		targets, l, err := tf.resolve()
		if err != nil {
			return err
		}
		if l != nil {
			o.Lab = l.Spec.Name
			o.KeepUnderlay = len(l.Spec.RxCPUs) > 0
			if lab.HostEndpoints(l.Spec.Style) {
				return fmt.Errorf("lab %q is %s style (no container overlay: no bridge, veth or container for a mode to work on): attach needs a docker or flannel lab; nothing was changed", l.Spec.Name, l.Spec.Style)
			}
		}
		// Parse once before any target is touched: a typo fails here and changes nothing.
		if _, err := datapath.Configure(m.Name(), o); err != nil {
			return err
		}
		return attachAll(targets, m.Name(), o, asJSON)
	}
	return c
}

// attachAll attaches to every target, all or nothing.
func attachAll(targets []string, mode string, o datapath.Options, asJSON bool) error {
	for _, t := range targets {
		if s := agent.Managing(t); s != nil {
			fmt.Fprintf(os.Stderr, "note: the node agent (pid %d, config %s) manages %s; it leaves an attachment of a mode its config does not name alone\n", s.PID, s.Config, label(t))
		}
	}
	var done []*datapath.State
	for _, t := range targets {
		st, err := datapath.Attach(context.Background(), t, mode, o)
		if err != nil {
			for _, d := range done {
				_, _ = datapath.Detach(context.Background(), d.Target, d.Mode)
			}
			return err
		}
		done = append(done, st)
	}
	if asJSON {
		return printJSON(os.Stdout, done)
	}
	for _, st := range done {
		fmt.Printf("attached %s to %s: %d devices, %d knobs changed\n", st.Mode, label(st.Target), len(st.Topology.Devs), len(st.Knobs))
		for _, n := range st.Topology.Notes {
			fmt.Printf("  note: %s\n", n)
		}
	}
	return nil
}
