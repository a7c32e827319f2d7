package datapath

import (
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
)

// Runtime is what a mode needs from the program that hosts it (the CLI with its node agent, a
// test binary): how to open a rack, how to tell that the node agent runs, where to log. That
// program's main hands it over with UseRuntime, explicitly, instead of init() functions of
// whichever packages it happens to link writing other packages' variables (behaviour used to
// depend on the link). Every field may be left zero: the default is given beside it.
//
// It is one value per process rather than an argument of Load and RunAgent because capabilities
// without a context (ModeCounters, Reporter) need it too, and changing every mode's signatures
// is a change of its own (issue 31, item 2).
type Runtime struct {
	// OpenRack opens the rack (a `lab up --tor` lab) a config names, for modes that offload to
	// top-of-rack switches (ezpath). Nil: this program opens none (the mode says so).
	OpenRack func(name string) (Rack, error)
	// NodeAgentRunning tells whether the node agent with pid, managing target, runs. Nil: by
	// its PID alone (agentproc.IsNodeAgent); the node agent's package adds its status file's
	// heartbeat, for an agent in another PID namespace where the PID means nothing.
	NodeAgentRunning func(pid int, target string) bool
	// Log is the logger of the framework and the mode agents. Nil: slog.Default().
	Log *slog.Logger
}

var runtime atomic.Pointer[Runtime]

// UseRuntime makes rt this process's runtime. Call it first thing in main (or TestMain).
func UseRuntime(rt Runtime) { runtime.Store(&rt) }

// CurrentRuntime is this process's runtime (zero until UseRuntime), with Log filled in.
func CurrentRuntime() Runtime {
	var rt Runtime
	if p := runtime.Load(); p != nil {
		rt = *p
	}
	if rt.Log == nil {
		rt.Log = slog.Default()
	}
	return rt
}

// Rack is the hardware a mode offloads to, as the mode needs to see it: hosts (from 1) with a
// top-of-rack switch each, the tenants' overlays (from 1) and their containers. A `lab up --tor`
// lab implements it (lab.Rack); the program hands a way to open one by name in its Runtime, so
// no mode depends on the lab.
type Rack interface {
	Name() string  // for messages (the lab's name)
	Style() string // the overlay's style ("docker": one L2 overlay per tenant)
	HasToR() bool
	Hosts() int
	Tenants() int
	MTU() int // the underlay's
	VXLANPort() int
	TenantVNI(t int) uint32
	HostNs(i int) string
	ToRNs(i int) string
	OverlayNs(i, t int) string // tenant t's bridge namespace on host i
	ToRPorts() (up, down string)
	ToRAddr(i int) netip.Addr  // ToR i's own address: its VTEP
	HostAddr(i int) netip.Addr // host i's underlay address
	ToRUpMAC(i int) net.HardwareAddr
	Containers() int
	// Container is the k-th container (from 0): its short name, host, tenant, overlay address
	// and its port (bridge-side veth) in its overlay namespace.
	Container(k int) (name string, host, tenant int, addr netip.Prefix, port string, err error)
}
