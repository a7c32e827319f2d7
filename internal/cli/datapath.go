package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode, for attach and status
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// targetFlags select which host namespaces a datapath command works on.
type targetFlags struct {
	netns   string
	useLab  bool
	labName string
}

func (t *targetFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&t.netns, "netns", "", "host network namespace to work on (default: the current one, i.e. this node)")
	c.Flags().BoolVar(&t.useLab, "lab", false, "work on every host of a lab (see --name)")
	c.Flags().StringVar(&t.labName, "name", lab.DefaultName, "with --lab: the lab's name")
	c.MarkFlagsMutuallyExclusive("netns", "lab")
}

// resolve returns the target namespaces and, for a lab, the lab.
func (t *targetFlags) resolve() ([]string, *lab.Lab, error) {
	if !t.useLab {
		return []string{t.netns}, nil, nil
	}
	l, err := lab.Status(t.labName)
	if err != nil {
		return nil, nil, err
	}
	var nss []string
	for _, h := range l.Hosts {
		nss = append(nss, h.Netns)
	}
	return nss, l, nil
}

// modeCommands is every mode's own command tree (datapath.Commander: `peregrine prism ...`),
// declared in the mode's package; the CLI lends them its target flags.
func modeCommands() []*cobra.Command {
	host := datapath.CLIHost{
		AddTargetFlags: func(c *cobra.Command) func() ([]string, error) {
			tf := &targetFlags{}
			tf.add(c)
			return func() ([]string, error) {
				nss, _, err := tf.resolve()
				return nss, err
			}
		},
		DefaultLab: lab.DefaultName,
		PrintJSON:  printJSON,
	}
	var cs []*cobra.Command
	for _, m := range datapath.Modes() {
		if cm, ok := m.(datapath.Commander); ok {
			cs = append(cs, cm.Commands(host))
		}
	}
	return cs
}

func modeList() string {
	var b strings.Builder
	for _, m := range datapath.Modes() {
		fmt.Fprintf(&b, "  %-8s %s\n", m.Name(), m.Summary())
	}
	return b.String()
}

func label(ns string) string { return netnsutil.Label(ns) }

func newDetachCmd() *cobra.Command {
	var tf targetFlags
	var all, force bool
	var mode string
	c := &cobra.Command{
		Use:   "detach",
		Short: "Detach the modes on this node (or lab hosts) and restore every knob they changed",
		Long: `Detach undoes attachments from their records, the most recent first: programs, then knobs
(written back byte for byte), pins and the record. Modes that change no knob in common can be
stacked on one node (e.g. falcon and prism); --mode detaches one of them.`,
		Example: `  sudo peregrine detach
  sudo peregrine detach --lab
  sudo peregrine detach --lab --mode prism   # keep the others
  sudo peregrine detach --all                # every recorded attachment`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var targets []string
			if all {
				states, err := datapath.AllStates()
				if err != nil {
					return err
				}
				seen := map[string]bool{}
				for _, st := range states {
					if !seen[st.Target] {
						seen[st.Target] = true
						targets = append(targets, st.Target)
					}
				}
				if len(targets) == 0 {
					fmt.Fprintln(os.Stderr, "nothing is attached anywhere")
					return nil
				}
			} else {
				var err error
				if targets, _, err = tf.resolve(); err != nil {
					return err
				}
			}
			if !force {
				for _, t := range targets {
					if s := agent.Managing(t); s != nil {
						return agent.RefuseManaged(s, "a detach")
					}
				}
			}
			var errs []error
			for _, t := range targets {
				sts, err := datapath.Detach(context.Background(), t, mode)
				if err != nil {
					errs = append(errs, err)
				}
				for _, st := range sts {
					fmt.Printf("detached %s from %s: %d knobs restored\n", st.Mode, label(t), len(st.Knobs))
				}
			}
			return errors.Join(errs...)
		},
	}
	tf.add(c)
	c.Flags().BoolVar(&all, "all", false, "detach every recorded attachment")
	c.Flags().BoolVar(&force, "force", false, "detach also what a running node agent manages (it attaches it again on its next reconcile unless its config changes)")
	c.Flags().StringVar(&mode, "mode", "", "detach only this mode (default: every mode on the target)")
	return c
}

func newStatusCmd() *cobra.Command {
	var asJSON, verbose bool
	c := &cobra.Command{
		Use:   "status",
		Short: "Show what is attached where, the devices found, and whether each knob still holds",
		Example: `  sudo peregrine status
  sudo peregrine status -v        # every knob with its old, set and live value
  sudo peregrine status --json  # {"node_agents": [...], "attachments": [...]}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			states, err := datapath.AllStates()
			if err != nil {
				return err
			}
			if len(states) > 0 {
				// Live state (maps, knobs) read where the pins are out of sight would be wrong.
				if err := datapath.CheckPinFS(); err != nil {
					return fmt.Errorf("status: %w", err)
				}
			}
			agents, err := agent.AllStatuses()
			if err != nil {
				return err
			}
			if asJSON {
				type agentView struct {
					*agent.Status
					Running bool `json:"running"`
				}
				type knobView struct {
					datapath.Knob
					Live string `json:"live"`
				}
				type view struct {
					*datapath.State
					Live []knobView `json:"live_knobs"`
				}
				// Both lists are always present (empty, never null) so a script can index them.
				out := struct {
					NodeAgents  []agentView `json:"node_agents"`
					Attachments []view      `json:"attachments"`
				}{[]agentView{}, []view{}}
				for _, a := range agents {
					out.NodeAgents = append(out.NodeAgents, agentView{a, a.Running()})
				}
				for _, st := range states {
					v := view{State: st}
					for _, k := range st.Knobs {
						v.Live = append(v.Live, knobView{k, datapath.CurrentValue(k)})
					}
					out.Attachments = append(out.Attachments, v)
				}
				return printJSON(cmd.OutOrStdout(), out)
			}
			for _, a := range agents {
				fmt.Print(a.Format())
			}
			if len(states) == 0 {
				fmt.Println("nothing attached (modes: " + strings.Join(datapath.ModeNames(), ", ") + ")")
				return nil
			}
			for _, st := range states {
				state := "attached"
				if !st.Complete {
					state = "INCOMPLETE (attach was interrupted: run `peregrine detach` to restore)"
				}
				fmt.Printf("%s on %s: %s since %s\n", st.Mode, label(st.Target), state, st.Attached.Format("2006-01-02 15:04:05"))
				if st.Managed {
					fmt.Printf("  managed by the node agent (change its config to change this attachment)\n")
				}
				for _, stage := range []string{datapath.StageNIC, datapath.StageVXLAN, datapath.StageVethHost, datapath.StageVeth} {
					var names []string
					for _, d := range st.Topology.ByStage(stage) {
						names = append(names, d.String())
					}
					if len(names) > 0 {
						fmt.Printf("  %-9s %s\n", stage, strings.Join(names, " "))
					}
				}
				held := 0
				tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
				for _, k := range st.Knobs {
					live := datapath.CurrentValue(k)
					ok := datapath.SameValue(live, k.New)
					if ok {
						held++
					}
					if verbose || !ok {
						mark := "ok"
						if !ok {
							mark = "CHANGED SINCE ATTACH"
						}
						fmt.Fprintf(tw, "    %s\told %s\tset %s\tlive %s\t%s\n", k, k.Old, k.New, live, mark)
					}
				}
				tw.Flush()
				fmt.Printf("  knobs: %d of %d hold their set value\n", held, len(st.Knobs))
				if m, err := datapath.Lookup(st.Mode); err == nil && st.Complete {
					if r, ok := m.(datapath.Reporter); ok {
						text, err := r.Report(st)
						if err != nil {
							fmt.Printf("  live state unavailable: %v\n", err)
						} else {
							fmt.Print(text)
						}
					}
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "JSON for machines")
	c.Flags().BoolVarP(&verbose, "verbose", "v", false, "list every knob")
	return c
}

func newUninstallCmd() *cobra.Command {
	var force, stay, check bool
	c := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove everything peregrine put on this machine: every attachment (knobs restored), pins and state",
		Long: `Uninstall detaches every recorded attachment on this machine (programs, then every knob written
back, pins and records), then removes the pin root (/sys/fs/bpf/peregrine) and peregrine's state
under /run/peregrine. A running node agent would attach again: stop it first (systemctl stop
peregrine-agent, or delete the DaemonSet), or give --force.

--check changes nothing: it lists what is left and exits 1 if anything is. --stay keeps the
process running after a successful uninstall, until SIGTERM (a DaemonSet's pod that exits is
restarted: deploy/kubernetes/uninstall runs ` + "`uninstall --stay`" + ` on every node, with
` + "`uninstall --check`" + ` as its readiness probe).`,
		Example: `  sudo peregrine uninstall
  sudo peregrine uninstall --check     # exit 0 when nothing is left
  kubectl apply -k deploy/kubernetes/uninstall   # every node of a cluster (deploy/README.md)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SilenceUsage = true
			if check {
				left, err := agent.Leftovers()
				if err != nil {
					return err
				}
				for _, l := range left {
					fmt.Println("left:", l)
				}
				if len(left) > 0 {
					return fmt.Errorf("%d things left: run `peregrine uninstall`", len(left))
				}
				fmt.Println("nothing of peregrine is left on this machine")
				return nil
			}
			done, err := agent.Uninstall(context.Background(), force)
			for _, st := range done {
				fmt.Printf("detached %s from %s: %d knobs restored\n", st.Mode, label(st.Target), len(st.Knobs))
			}
			if err != nil {
				return err
			}
			fmt.Println("peregrine removed: no attachment, pin or state left")
			if stay {
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
				defer stop()
				<-ctx.Done()
			}
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "uninstall even while a node agent runs")
	c.Flags().BoolVar(&stay, "stay", false, "after a successful uninstall, keep running until SIGTERM (the uninstall DaemonSet)")
	c.Flags().BoolVar(&check, "check", false, "change nothing: list what is left, exit 1 if anything is")
	c.MarkFlagsMutuallyExclusive("check", "stay")
	c.MarkFlagsMutuallyExclusive("check", "force")
	return c
}
