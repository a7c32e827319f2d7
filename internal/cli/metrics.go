package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/metrics"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
)

func newMetricsCmd() *cobra.Command {
	var listen string
	var withStage bool
	c := &cobra.Command{
		Use:   "metrics",
		Short: "Serve Prometheus metrics: per-CPU receive counters, attachments, and (optionally) per-stage packets",
		Long: `Serves /metrics in the Prometheus text format until interrupted:

  peregrine_softnet_total{cpu,counter}           /proc/net/softnet_stat (processed, dropped, time_squeeze, ...)
  peregrine_softirqs_total{cpu,type}             NET_RX and NET_TX softirqs
  peregrine_attached{mode,target,complete}       datapath attachments on record
  peregrine_knobs / peregrine_knobs_held         knobs an attachment set, and how many still hold
  peregrine_stage_packets_total{netns,device,cpu}      with --stage-probe: packets per device and CPU
  peregrine_stage_softirq_seconds_total{netns,device,cpu}  with --stage-probe: NET_RX time per device and CPU

Values are gathered by one goroutine at most every 5 s while someone scrapes, and each request
gets that snapshot: its cost does not grow with the flow tables or with the number of clients
(at most 4 requests at once, 503 beyond). The stage probe loads eBPF tracepoint programs for as
long as the command runs.`,
		Example: `  sudo peregrine metrics --listen 127.0.0.1:9465
  sudo peregrine metrics --stage-probe &  curl -s 127.0.0.1:9465/metrics | grep stage_packets`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var sp *stage.Probe
			if withStage {
				p, err := stage.Start(stage.Options{})
				if err != nil {
					return fmt.Errorf("stage probe: %w", stage.Explain(err))
				}
				defer p.Close()
				sp = p
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			fmt.Fprintf(os.Stderr, "serving http://%s/metrics (Ctrl-C to stop)\n", l.Addr())
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return metrics.Serve(ctx, l, metrics.New(sp))
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:9465", "address to serve /metrics on")
	c.Flags().BoolVar(&withStage, "stage-probe", false, "load the eBPF stage probe and export per-device, per-CPU packets and softirq time")
	return c
}
