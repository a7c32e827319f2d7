package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// newAgentCmd is the node agent (`agent --config FILE`: one supervised process per node, see
// docs/agent.md) and, hidden, a single mode's agent (`agent MODE --target NS`), which a CLI
// attach without a node agent starts detached and detach stops.
func newAgentCmd() *cobra.Command {
	var target, config, netns, logFormat string
	var cleanup bool
	c := &cobra.Command{
		Use:   "agent --config FILE [--netns NS] [--cleanup-on-exit]",
		Short: "Run the node agent: attach the configured modes and keep them so (systemd, DaemonSet)",
		Long: `The node agent is the node's one long-running peregrine process, in the foreground, logging
to stderr. It reads a YAML config (modes and their options: see deploy/config.yaml and
docs/agent.md), attaches the modes, runs their agents inside itself and reconciles every
reconcile_interval: a knob changed by hand is written again, a program detached by hand is
attached again. SIGHUP or a change of the file applies the difference (prism rules live; a mode
whose options changed is detached and attached; the others are untouched); an invalid config is
refused with the key and the reason and the running state kept. It serves /healthz, /readyz
and /metrics on listen (loopback; another address only with listen_remote: true), at most 4
/metrics requests at once from a snapshot at most 5 s old.

One agent per network namespace: a second one (even under another name of the namespace) exits
1 naming the first. SIGHUP is caught from the process's start; under systemd (Type=notify) the
agent sends READY=1 once started.

SIGTERM or SIGINT: exit 0, leaving the datapath in place; the next start adopts it (same links,
flows kept; a newer fastpath program replaces the old one atomically). --cleanup-on-exit (or
` + "`peregrine uninstall`" + `) removes everything instead.`,
		Example: `  sudo peregrine agent --config /etc/peregrine/config.yaml
  sudo peregrine agent --config lab.yaml --netns prg-lab-h1 --log-format json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if config == "" {
				if len(args) == 1 {
					return runModeAgent(args[0], target)
				}
				return fmt.Errorf("give --config FILE (see `peregrine agent --help`)")
			}
			if len(args) > 0 {
				return fmt.Errorf("the node agent takes no MODE: name the modes in %s", config)
			}
			var h slog.Handler
			switch logFormat {
			case "text":
				h = slog.NewTextHandler(os.Stderr, nil)
			case "json":
				h = slog.NewJSONHandler(os.Stderr, nil)
			default:
				return fmt.Errorf("--log-format %q: want text or json", logFormat)
			}
			slog.SetDefault(slog.New(h))
			cmd.SilenceUsage = true
			return agent.Run(context.Background(), agent.Options{ConfigPath: config, Netns: netns,
				NetnsSet: cmd.Flags().Changed("netns"), CleanupOnExit: cleanup})
		},
	}
	c.Flags().StringVar(&config, "config", "", "the node agent's YAML config file")
	c.Flags().StringVar(&netns, "netns", "", "host network namespace to manage (overrides the config's netns)")
	c.Flags().BoolVar(&cleanup, "cleanup-on-exit", false, "detach everything and restore every knob when stopped (default: leave the datapath for the next start to adopt)")
	c.Flags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	c.Flags().StringVar(&target, "target", "", "with MODE: host network namespace of the attachment (\"\" = this node)")
	_ = c.Flags().MarkHidden("target")
	return c
}

// runModeAgent runs one mode's agent in the foreground (started detached by a CLI attach
// without a node agent).
func runModeAgent(mode, target string) error {
	m, err := datapath.Lookup(mode)
	if err != nil {
		return err
	}
	r, ok := m.(datapath.AgentRunner)
	if !ok {
		return fmt.Errorf("mode %s has no agent", m.Name())
	}
	return r.RunAgent(context.Background(), target)
}
