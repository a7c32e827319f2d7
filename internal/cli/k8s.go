package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab/k8s"
)

// The k8s style of `lab up`: a real Kubernetes cluster (internal/lab/k8s). Its own flags are
// added to `lab up`; down, status and exec reach it as the lab named "k8s".

type k8sUpFlags struct {
	nodes     int
	noAgent   bool
	noPolicy  bool
	binary    string
	repo      string
	rxCPU     int
	proxyMode *string
}

func addK8sUpFlags(f *pflag.FlagSet, proxyMode *string) *k8sUpFlags {
	k := &k8sUpFlags{proxyMode: proxyMode}
	f.IntVar(&k.nodes, "nodes", 2, "k8s style: Kubernetes nodes (node 1 also runs the control plane)")
	f.BoolVar(&k.noAgent, "no-agent", false, "k8s style: do not install peregrine's DaemonSet")
	f.BoolVar(&k.noPolicy, "no-network-policy", false, "k8s style: do not run kube-router's NetworkPolicy controller")
	f.StringVar(&k.binary, "agent-binary", "", "k8s style: the static peregrine binary the agent's image is made of (default: this one)")
	f.StringVar(&k.repo, "repo", ".", "k8s style: peregrine's source tree (deploy/config.yaml and deploy/kubernetes)")
	f.IntVar(&k.rxCPU, "rx-cpu", 0, "k8s style: the CPU the underlay's receive (NAPI thread, RPS) runs on, as a NIC's IRQ core")
	return k
}

func (k *k8sUpFlags) up(cmd *cobra.Command, name string, asJSON bool) error {
	for _, fl := range []string{"hosts", "containers", "underlay", "mtu", "rx-cpus", "no-gro", "napi-thread", "veth-offloads", "file", "tor", "tor-cpus", "services", "tenants"} {
		if cmd.Flags().Changed(fl) {
			return fmt.Errorf("--%s does not apply to --style k8s (its flags: --nodes, --proxy-mode, --no-agent, --no-network-policy, --agent-binary, --repo, --rx-cpu)", fl)
		}
	}
	if name != k8s.Name && cmd.Flags().Changed("name") {
		return fmt.Errorf("--name %q: the k8s lab is always named %q (one cluster per machine)", name, k8s.Name)
	}
	s := k8s.Spec{Nodes: k.nodes, ProxyMode: *k.proxyMode, NetworkPolicy: !k.noPolicy, Agent: !k.noAgent, Repo: k.repo, RxCPU: k.rxCPU, Forget: datapath.ForgetNamespaces}
	if s.Agent {
		s.AgentBinary = k.binary
		if s.AgentBinary == "" {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			s.AgentBinary = exe
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "bringing up the k8s lab: Kubernetes %s, %d nodes\n", k8s.KubernetesVersion, s.Nodes)
	c, err := k8s.Up(ctx, s, stderrLog)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(os.Stdout, c)
	}
	fmt.Fprintf(os.Stderr, "k8s lab is up and verified in %s\n\n", c.Took)
	return printK8s(cmd.Context(), c)
}

func printK8s(ctx context.Context, c *k8s.Cluster) error {
	if ctx == nil {
		ctx = context.Background()
	}
	fmt.Printf("k8s lab: Kubernetes %s, %d nodes, kube-proxy %s, NetworkPolicy %v, peregrine agent %v; state in %s\n\n",
		k8s.KubernetesVersion, c.Spec.Nodes, c.Spec.ProxyMode, c.Spec.NetworkPolicy, c.Spec.Agent, c.Dir)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNAMESPACE\tADDRESS\tPOD CIDR")
	for _, n := range c.Nodes {
		fmt.Fprintf(tw, "n%d\t%s\t%s\t%s\n", n.Index, n.Name, n.Addr, n.PodCIDR)
	}
	tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DAEMON\tRUNNING\tLOG")
	for _, d := range c.Daemons() {
		fmt.Fprintf(tw, "%s\t%v\t%s\n", d.Name, d.Running, d.Log)
	}
	tw.Flush()
	if out, err := c.Kubectl(ctx, "get", "pods", "-A", "-o", "wide"); err == nil {
		fmt.Printf("\n%s", out)
	}
	fmt.Println("\nkubectl: peregrine lab kubectl -- get pods -A    shell on a node: peregrine lab exec --name k8s n1 -- sh")
	return nil
}

func k8sStatus(asJSON bool) error {
	c, err := k8s.Load()
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(os.Stdout, struct {
			*k8s.Cluster
			Daemons []k8s.Daemon `json:"daemons"`
		}{c, c.Daemons()})
	}
	if err := printK8s(context.Background(), c); err != nil {
		return err
	}
	return c.Healthy(context.Background())
}

// k8sExec runs a command on a node: in its network and mount namespace, as its daemons run.
func k8sExec(node string, argv []string) error {
	c, err := k8s.Load()
	if err != nil {
		return err
	}
	i, err := c.NodeIndex(node)
	if err != nil {
		return err
	}
	x := k8s.Exec(context.Background(), i, argv...)
	x.Stdin, x.Stdout, x.Stderr = os.Stdin, os.Stdout, os.Stderr
	return exitErr(argv[0], x.Run())
}

func exitErr(prog string, err error) error {
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) {
		return fmt.Errorf("%s exited with status %d", prog, ee.ExitCode())
	}
	return err
}

func newLabKubectlCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "kubectl -- ARGS...",
		Short: "Run kubectl " + k8s.KubernetesVersion + " as the k8s lab's admin (lab up --style k8s)",
		Example: `  peregrine lab kubectl -- get pods -A -o wide
  peregrine lab kubectl -- -n kube-system logs ds/peregrine-agent`,
		Args:               cobra.MinimumNArgs(1),
		DisableFlagParsing: false,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := k8s.Load()
			if err != nil {
				return err
			}
			x := c.KubectlCmd(context.Background(), args...)
			x.Stdin, x.Stdout, x.Stderr = os.Stdin, os.Stdout, os.Stderr
			return exitErr("kubectl", x.Run())
		},
	}
}
