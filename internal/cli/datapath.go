package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/falcon"   // registers mode "falcon"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath" // registers mode "fastpath"
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

func newAttachCmd() *cobra.Command {
	var tf targetFlags
	var o datapath.Options
	var cpus string
	var asJSON bool
	var ff falconFlags
	var pf prismFlags
	var mf mflowFlags
	var ef ezpathFlags
	var oneWay bool
	c := &cobra.Command{
		Use:   "attach MODE",
		Short: "Attach a datapath mode to this node's overlay (or to lab hosts)",
		Long: `Attach discovers the overlay behind a host network namespace (VXLAN devices, the underlay
NIC behind them, the bridges and both ends of every container veth), records every knob it
will change with its current value, then applies the mode. "peregrine detach" restores the
record exactly, also from a new process after a crash.

Modes:
` + modeList() + `
In a lab built with --rx-cpus, the underlay's receive mask stands in for the NIC's IRQ
affinity and is left alone.`,
		Example: `  sudo peregrine attach fastpath --lab          # overlay fast path on every lab host (start here)
  sudo peregrine attach fastpath                # this node's overlay (flannel.1/cni0 or docker's vxlan0/br0)
  sudo peregrine attach rps                     # this node (current namespace)
  sudo peregrine attach rps --lab               # every host of the lab "lab"
  sudo peregrine attach rps --lab --name fl     # every host of the lab "fl"
  sudo peregrine attach rps --netns prg-lab-h2 --cpus 1
  sudo peregrine attach rps --underlay ens5     # when discovery cannot tell the NIC
  sudo peregrine attach falcon --lab --cpus 0-1 --threshold 85 --interval 20ms
  sudo peregrine attach falcon --static         # first choice only (no two-choice balancing)
  sudo peregrine attach falcon --lab --split-cpus 1 --split auto   # GRO split only while the NIC core saturates
  sudo peregrine attach mflow --lab --cpus 0-1 --batch 256 --elephant-pps 10000
  sudo peregrine attach mflow --split-at device --merge
  sudo peregrine attach ezpath --lab --policy auto --table-size 64   # a lab built with --tor`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := datapath.Lookup(args[0]); err != nil {
				return err
			}
			if cpus != "" {
				list, err := parseCPUList(cpus)
				if err != nil {
					return fmt.Errorf("--cpus: %w", err)
				}
				o.CPUs = list
			}
			extra, err := ff.extra(cmd, args[0])
			if err != nil {
				return err
			}
			o.Extra = extra
			if err := pf.extra(cmd, args[0], o.Extra); err != nil {
				return err
			}
			if err := mf.extra(cmd, args[0], o.Extra); err != nil {
				return err
			}
			if err := ef.extra(cmd, args[0], &tf, o.Extra); err != nil {
				return err
			}
			if cmd.Flags().Changed("one-way") {
				if args[0] != fastpath.Name {
					return fmt.Errorf("--one-way is a fastpath flag; mode %s does not take it", args[0])
				}
				o.Extra[fastpath.OptOneWay] = fmt.Sprint(oneWay)
			}
			targets, l, err := tf.resolve()
			if err != nil {
				return err
			}
			if l != nil && len(l.Spec.RxCPUs) > 0 {
				o.KeepUnderlay = true
			}
			if l != nil && lab.HostEndpoints(l.Spec.Style) {
				return fmt.Errorf("lab %q is %s style (no container overlay: no bridge, veth or container for a mode to work on): attach needs a docker or flannel lab; nothing was changed", l.Spec.Name, l.Spec.Style)
			}
			var done []*datapath.State
			for _, t := range targets {
				st, err := datapath.Attach(context.Background(), t, args[0], o)
				if err != nil {
					// All or nothing across the lab's hosts.
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
		},
	}
	tf.add(c)
	c.Flags().StringVar(&o.Underlay, "underlay", "", "underlay NIC, when discovery cannot tell it")
	c.Flags().StringVar(&cpus, "cpus", "", "CPUs the mode may use, e.g. 0-3 (default: all online CPUs)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the attachment records as JSON")
	ff.add(c)
	pf.add(c)
	c.Flags().BoolVar(&oneWay, "one-way", false, "fastpath: a flow the normal path delivered to a pod takes the ingress fast path without waiting for a reply (one-way streams); default: only flows carried both ways")
	mf.add(c)
	ef.add(c)
	return c
}

// falconFlags are the paper's knobs of mode falcon (FALCON_CPUS is --cpus).
type falconFlags struct {
	threshold int
	static    bool
	interval  time.Duration
	repick    time.Duration
	splitCPUs string
	split     string
	load      string
}

func (f *falconFlags) add(c *cobra.Command) {
	c.Flags().IntVar(&f.threshold, "threshold", falcon.DefaultThreshold, "falcon: load threshold in percent (0-100): at or above it on average the gate closes, per CPU it rejects a first choice")
	c.Flags().BoolVar(&f.static, "static", false, "falcon: first choice only (the paper's \"static\"); default is two-choice (\"dynamic\")")
	c.Flags().DurationVar(&f.interval, "interval", falcon.DefaultInterval, "falcon: load monitor period; ezpath: controller polling period (when not given: 1s for ezpath, the default below for falcon)")
	c.Flags().DurationVar(&f.repick, "repick", falcon.DefaultRepick, "falcon: idle time after which a flow's CPU choice may be re-picked")
	c.Flags().StringVar(&f.splitCPUs, "split-cpus", "", "falcon: GRO split CPUs (XDP+cpumap on the underlay), e.g. 1")
	c.Flags().StringVar(&f.load, "load", string(falcon.DefaultLoad), "falcon: what counts as a CPU's load: kernel (system+irq+softirq+steal: application time is room for packet stages, since a softirq runs ahead of it) or busy (all non-idle time, the paper's prototype)")
	c.Flags().StringVar(&f.split, "split", "", "falcon: GRO split on|off|auto (default: on when --split-cpus is given); auto: the node agent attaches the split while the NIC core saturates and detaches it once it cools, with hysteresis")
}

// extra turns the flags given into the mode's options; falcon's flags on another mode are an error.
func (f *falconFlags) extra(c *cobra.Command, mode string) (map[string]string, error) {
	names := []string{"threshold", "static", "interval", "repick", "split-cpus", "split", "load"}
	m := map[string]string{}
	for _, n := range names {
		fl := c.Flags().Lookup(n)
		if !fl.Changed {
			continue
		}
		if mode != falcon.Name {
			if n == "interval" && mode == "ezpath" {
				continue // ezpath's polling period (ezpathFlags)
			}
			return nil, fmt.Errorf("--%s is a falcon flag; mode %s does not take it", n, mode)
		}
		key := strings.ReplaceAll(n, "-", "_")
		m[key] = fl.Value.String()
	}
	return m, nil // datapath.Attach parses them (Configure) before anything is discovered
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
	var all bool
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
  sudo peregrine status --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			states, err := datapath.AllStates()
			if err != nil {
				return err
			}
			if asJSON {
				type knobView struct {
					datapath.Knob
					Live string `json:"live"`
				}
				type view struct {
					*datapath.State
					Live []knobView `json:"live_knobs"`
				}
				var out []view
				for _, st := range states {
					v := view{State: st}
					for _, k := range st.Knobs {
						v.Live = append(v.Live, knobView{k, datapath.CurrentValue(k)})
					}
					out = append(out, v)
				}
				return printJSON(os.Stdout, out)
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
