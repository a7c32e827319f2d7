package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
)

// newLabRealFlannelCmd drives the real flannel lab (internal/lab/realflannel): etcd, flanneld
// and the flannel CNI plugin themselves, built by scripts/setup.sh.
func newLabRealFlannelCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "real-flannel",
		Short: "Bring up or remove N nodes x K pods on the real flannel binaries (etcd, flanneld VXLAN, CNI ADD/DEL)",
		Long: `The real flannel lab: nodes prg-<name>-nI whose eth0 are NIC-like (GRO, pfifo_fast, checksums on
the wire): with 2 nodes one veth pair between them and etcd (Debian's etcd-server, the subnet store) on
node 1; with 3 or more a bridge in prg-<name>-ul, where etcd runs; flanneld ` + realflannel.FlannelVersion + ` (VXLAN backend, --iface eth0) in
every node; pods prg-<name>-nI-pJ made by cnitool ` + realflannel.CNIToolVersion + ` ADD through the
flannel CNI plugin ` + realflannel.CNIPluginsVersion + `, which delegates to bridge (cni0) and host-local.
scripts/setup.sh builds the binaries once into ` + realflannel.CacheDir + `.
Run-time state (pid files, logs, etcd's data, subnet files, CNI state) is in ` + realflannel.StateRoot + `/<name>;
down removes it with every process and namespace.`,
	}
	var spec realflannel.Spec
	up := &cobra.Command{
		Use:     "up [NAME]",
		Short:   "Bring up the lab (removing what an earlier one of the same name left) and check pod to pod",
		Example: "  peregrine lab real-flannel up rf --nodes 2 --pods 2\n  peregrine attach fastpath --netns prg-rf-n1",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec.Name = "rf"
			if len(args) == 1 {
				spec.Name = args[0]
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			l, err := realflannel.Up(ctx, spec, stderrLog)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "real flannel lab %q is up\n\n", spec.Name)
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAMESPACE\tADDRESS\tSUBNET")
			for _, n := range l.Nodes {
				fmt.Fprintf(w, "%s\t%s\t%s\n", n.Netns, n.Underlay, n.Subnet)
				for _, p := range l.Pods {
					if p.Node == n.Index {
						fmt.Fprintf(w, "  %s\t%s\t\n", p.Netns, p.Addr)
					}
				}
			}
			return w.Flush()
		},
	}
	up.Flags().IntVar(&spec.Nodes, "nodes", 2, "node namespaces, each with its flanneld")
	up.Flags().IntVar(&spec.Pods, "pods", 1, "pods per node, made by CNI ADD")
	down := &cobra.Command{
		Use:   "down [NAME]",
		Short: "CNI DEL every pod, stop etcd and every flanneld, remove the namespaces and all state",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "rf"
			if len(args) == 1 {
				name = args[0]
			}
			return realflannel.Down(name)
		},
	}
	c.AddCommand(up, down)
	return c
}
