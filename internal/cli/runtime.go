package cli

import (
	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// hostRuntime is what this program lends the modes it runs (datapath.Runtime), handed over by
// Main: a rack is a `lab up --tor` lab (the modes do not depend on the lab), and the node agent's
// status file tells that it runs across PID namespaces. The logger is slog's default, which the
// node agent sets up.
func hostRuntime() datapath.Runtime {
	return datapath.Runtime{OpenRack: openLabRack, NodeAgentRunning: agent.NodeAgentRunning}
}

func openLabRack(name string) (datapath.Rack, error) {
	r, err := lab.OpenRack(name)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return r, nil
}
