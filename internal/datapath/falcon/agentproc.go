package falcon

import (
	"context"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
)

// agentKit starts, stops and describes the node agent: this same binary run as
// `peregrine agent falcon --target=NS`, detached (internal/datapath/agentproc).
const agentKit = agentproc.Agent(Name)

// waitAgentReady waits for the agent's first gate update, so attach returns with falcon live.
func waitAgentReady(ctx context.Context, o *objects, st *datapath.State) error {
	return agentKit.WaitReady(ctx, st, 5*time.Second, func() bool {
		g, err := o.readGate()
		return err == nil && g.UpdatedNs != 0
	})
}
