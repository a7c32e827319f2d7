package ezpath

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// The mode's own commands, `peregrine ezpath ...` (datapath.Commander): move container pairs
// between the overlay and the switch path, list the flows the switches count.

// Commands is the `peregrine ezpath` command tree.
func (mode) Commands(host datapath.CLIHost) *cobra.Command {
	c := &cobra.Command{
		Use:   "ezpath",
		Short: "EZPath: move container pairs between the overlay and the ToR switch path, list flows",
		Long: `EZPath offloads selected container flows to the top-of-rack switches of a lab built
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
	c.AddCommand(newOffloadCmd(host, true), newOffloadCmd(host, false), newFlowsCmd(host))
	return c
}

func newOffloadCmd(host datapath.CLIHost, on bool) *cobra.Command {
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
				return fmt.Errorf("ezpath works on a lab's switches: add --lab (and --name if the lab is not %q)", host.DefaultLab)
			}
			var err error
			if on {
				err = Offload(name, args[0], args[1], "manual")
			} else {
				err = Unoffload(name, args[0], args[1], drain)
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
	c.Flags().StringVar(&name, "name", host.DefaultLab, "the lab's name")
	if !on {
		c.Flags().DurationVar(&drain, "drain", DefaultDrain, "wait between removing the hosts' rules and the switch entries")
	}
	return c
}

func newFlowsCmd(host datapath.CLIHost) *cobra.Command {
	var name string
	var asJSON bool
	c := &cobra.Command{
		Use:   "flows",
		Short: "List the overlay flows the ToR switches count: rate, state (offloaded or overlay) and path",
		Example: `  sudo peregrine ezpath flows
  sudo peregrine ezpath flows --name tr --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			views, err := Flows(name, time.Second)
			if err != nil {
				return err
			}
			led, err := ReadLedger(name)
			if err != nil {
				return err
			}
			if asJSON {
				return host.PrintJSON(os.Stdout, map[string]any{"flows": views, "pairs": led.Pairs, "refused": led.Refused})
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
	c.Flags().StringVar(&name, "name", host.DefaultLab, "the lab's name")
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
