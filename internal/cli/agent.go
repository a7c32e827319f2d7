package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// newAgentCmd runs a mode's node agent in the foreground. Attach starts it detached (its own
// session, log under /run/peregrine/agents) and detach stops it; people rarely run it by hand.
func newAgentCmd() *cobra.Command {
	var target string
	c := &cobra.Command{
		Use:    "agent MODE",
		Short:  "Run a datapath mode's node agent (started by attach, stopped by detach)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := datapath.Lookup(args[0])
			if err != nil {
				return err
			}
			r, ok := m.(datapath.AgentRunner)
			if !ok {
				return fmt.Errorf("mode %s has no agent", m.Name())
			}
			return r.RunAgent(context.Background(), target)
		},
	}
	c.Flags().StringVar(&target, "target", "", "host network namespace of the attachment (\"\" = this node)")
	return c
}
