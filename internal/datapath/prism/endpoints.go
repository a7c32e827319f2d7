package prism

import (
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// prism keeps its endpoints in the shared endpoint tables (internal/datapath/endpoints): its
// prism_ep_key/prism_ep have the layout of bpf/pod.h's prg_pod_key/prg_pod. A vanished
// container's endpoint stays a tombstone for endpoints.TombstoneTTL, dropping its HP frames.
type (
	vxlanDev     = endpoints.VXLAN
	endpoint     = endpoints.Endpoint
	syncReport   = endpoints.Report
	EndpointView = endpoints.View
)

func (o *objects) tables() endpoints.Tables {
	return endpoints.Tables{EP: o.PrgPrismEp, Port: o.PrgPrismPort}
}

func discoverVXLAN(t *datapath.Topology) ([]vxlanDev, error) { return endpoints.DiscoverVXLAN(t) }

func discoverEndpoints(t *datapath.Topology, vxs []vxlanDev) ([]endpoint, []string) {
	return endpoints.Discover(t, vxs)
}

func syncEndpoints(o *objects, want []endpoint, now time.Time) (syncReport, error) {
	return endpoints.Sync(o.tables(), want, now)
}

func (o *objects) endpoints() ([]EndpointView, error) { return endpoints.List(o.tables()) }
