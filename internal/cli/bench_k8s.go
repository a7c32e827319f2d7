package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/bench"
)

// k8sCompareFlags adapts `bench compare --style k8s`: its modes default to
// vanilla,fastpath,prism, and the flags that shape a lab the bench builds are refused (the
// cluster is up already and shaped by `lab up --style k8s`).
func k8sCompareFlags(cmd *cobra.Command, modes *[]string) error {
	for fl, why := range map[string]string{
		"proxy-mode":  "kube-proxy's mode is the cluster's (lab up --style k8s --proxy-mode nftables)",
		"tor":         "the cluster's nodes are joined by one veth pair",
		"napi-thread": "the cluster's nodes receive in a NAPI thread already (lab up --style k8s --rx-cpu)",
	} {
		if cmd.Flags().Changed(fl) {
			return fmt.Errorf("--%s does not apply to --style k8s: %s", fl, why)
		}
	}
	if !cmd.Flags().Changed("modes") {
		*modes = strings.Split(bench.K8sCompareModes, ",")
	}
	return nil
}
