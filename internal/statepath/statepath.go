// Package statepath says, once, where peregrine keeps its state and how it names what it creates.
// The packages that own each kind of state start their (test-overridable) variables from these,
// and internal/testutil looks for leftovers at the same places. A leaf: it imports nothing.
package statepath

// Prefix starts the name of every namespace, link and pinned object peregrine creates (labs
// included): what `lab down`, detach and the tests' leftover checks look for.
const Prefix = "prg-"

// Roots: records, logs and sockets on tmpfs (a reboot clears them with the namespaces and knobs
// they describe); pinned eBPF objects under bpffs.
const (
	Run  = "/run/peregrine"
	Pins = "/sys/fs/bpf/peregrine"
)

// Directories under Run.
const (
	Labs     = Run + "/labs"     // lab records (internal/lab)
	Datapath = Run + "/datapath" // datapath records, the lock (internal/datapath)
	Agents   = Run + "/agents"   // mode agents' logs (agentproc)
	Agent    = Run + "/agent"    // node agents' status files (internal/agent)
	PD       = Run + "/pd"       // PipeDevice's socket directory
)
