package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath/mflow" // registers mode "mflow"
)

// mflowFlags are attach's options for mode mflow (the splitting CPUs are --cpus).
type mflowFlags struct {
	batch       int
	elephantPPS string
	elephantBPS string
	window      time.Duration
	splitAt     string
	merge       bool
	mice        string
	queueSize   int
	guard       int
	guardHold   time.Duration
}

var mflowFlagNames = []string{"batch", "elephant-pps", "elephant-bps", "window", "split-at", "merge", "mice", "queue-size", "reorder-guard", "reorder-hold"}

func (f *mflowFlags) add(c *cobra.Command) {
	c.Flags().IntVar(&f.batch, "batch", mflow.DefaultBatch, "mflow: packets per micro-flow (batch); splitting CPUs are --cpus (default: 2)")
	c.Flags().StringVar(&f.elephantPPS, "elephant-pps", fmt.Sprint(mflow.DefaultElephantPPS), "mflow: split flows at or above this packet rate (0 = no packet-rate test)")
	c.Flags().StringVar(&f.elephantBPS, "elephant-bps", "0", "mflow: split flows at or above this bit rate, e.g. 500M (0 = no bit-rate test; both 0 = split every flow)")
	c.Flags().DurationVar(&f.window, "window", mflow.DefaultWindow, "mflow: rate window of the elephant test")
	c.Flags().StringVar(&f.splitAt, "split-at", mflow.SplitFullPath, "mflow: full-path (IRQ split with XDP, before skb allocation) or device (before the VXLAN device, tcx + RPS)")
	c.Flags().BoolVar(&f.merge, "merge", false, "mflow: run the transport of each split flow on ONE CPU (container veth RPS); narrows, does not remove, reordering")
	c.Flags().StringVar(&f.mice, "mice", "pass", "mflow: flows below the threshold: pass (normal path) or affine (one splitting CPU per flow)")
	c.Flags().IntVar(&f.guard, "reorder-guard", mflow.DefaultGuard, "mflow: reorder guard: this many out-of-order TCP segments of a split flow within one --window, seen where the flow enters the pod, put the flow back on one path for --reorder-hold (0 = off)")
	c.Flags().DurationVar(&f.guardHold, "reorder-hold", mflow.DefaultGuardHold, "mflow: how long the reorder guard holds a flow on one path the first time; each further hold doubles it, up to 16x")
	c.Flags().IntVar(&f.queueSize, "queue-size", 0, "mflow: cpumap ring per splitting CPU in frames (full-path; default 2048)")
}

// extra adds the mflow flags given to m; they are an error on another mode.
func (f *mflowFlags) extra(c *cobra.Command, mode string, m map[string]string) error {
	for _, n := range mflowFlagNames {
		fl := c.Flags().Lookup(n)
		if !fl.Changed {
			continue
		}
		if mode != mflow.Name {
			return fmt.Errorf("--%s is an mflow flag; mode %s does not take it", n, mode)
		}
		m[strings.ReplaceAll(n, "-", "_")] = fl.Value.String()
	}
	return nil // datapath.Attach parses them (Configure) before anything is discovered
}
