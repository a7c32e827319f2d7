package testbed

import (
	"context"
	"strings"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// offloadFeatures are the features recorded for every device on the receive path.
var offloadFeatures = map[string]string{
	"generic-receive-offload":      "gro",
	"generic-segmentation-offload": "gso",
	"tcp-segmentation-offload":     "tso",
	"rx-checksumming":              "rx-csum",
	"tx-checksumming":              "tx-csum",
	"rx-gro-list":                  "gro-list",
	"rx-udp-gro-forwarding":        "udp-gro-fwd",
}

// readOffloads records the offload state of every device of the nodes, keyed "node/device".
func readOffloads(ctx context.Context, nodes []lab.Node) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, n := range nodes {
		for _, d := range n.Devices {
			txt, err := netnsutil.Run(ctx, n.Netns, "ethtool", "-k", d.Name)
			if err != nil {
				continue
			}
			out[n.Name+"/"+d.Name] = parseEthtoolK(txt)
		}
	}
	return out
}

func parseEthtoolK(txt string) map[string]bool {
	f := map[string]bool{}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if short, ok := offloadFeatures[k]; ok {
			f[short] = strings.HasPrefix(strings.TrimSpace(v), "on")
		}
	}
	return f
}
