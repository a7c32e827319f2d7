package bench

import (
	"fmt"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
)

// Given names existing namespaces to measure between instead of building labs: any two
// namespaces on this machine (a real node's containers, another tool's test hosts).
type Given struct {
	ServerNS   string // receiving namespace
	ServerAddr string // address the sender reaches it at
	ClientNS   string // sending namespace ("" = the current one)
}

// StyleGiven marks the one config of a run on given namespaces.
const StyleGiven = "given"

func (g *Given) validate(scenario string) error {
	if g.ServerNS == "" || g.ServerAddr == "" {
		return fmt.Errorf("measuring between given namespaces needs --server-ns and --server-addr")
	}
	if _, err := netip.ParseAddr(g.ServerAddr); err != nil {
		return fmt.Errorf("--server-addr %q is not an IP address", g.ServerAddr)
	}
	if err := testbed.CheckExisting(g.ServerNS, g.ClientNS); err != nil {
		return err
	}
	if scenario == "udp-inject" {
		return fmt.Errorf("udp-inject needs a lab (it crafts frames from the lab's MACs and VNI): use --configs instead of given namespaces")
	}
	return nil
}

// name is the one config of a run on given namespaces.
func (g *Given) name() string { return "given:" + g.ClientNS + "->" + g.ServerNS }
