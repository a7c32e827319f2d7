// Package cli is peregrine's command line: one cobra command per file.
package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Version is set at build time (-ldflags "-X ...cli.Version=...").
var Version = "dev"

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "peregrine",
		Short: "Fast container overlay networking on a stock Linux kernel",
		Long: `peregrine speeds up container overlay networks (VXLAN + bridge + veth, as in Docker
overlay and Flannel) on an unmodified Linux kernel, with eBPF and the kernel's own steering knobs.

Its parts:
  lab      build container overlay topologies out of network namespaces on one machine
  attach   put a datapath mode on a node (or lab hosts); detach restores every knob
  status   show what is attached and what it changed
  bench    measure styles and modes side by side (ratios in one run), with probes
  report   turn result files into tables and an HTML report with plots
  metrics  serve Prometheus metrics of the node's receive path and attachments
  pd       PipeDevice: shared-memory rings between containers on one host (daemon, perf)

Everything peregrine creates is named with the prefix "prg-" (namespaces, links, pinned
objects under /sys/fs/bpf/peregrine), so "peregrine lab down --all" can always clean up.`,
		Example: `  # build a Docker-style overlay lab with 2 hosts x 2 containers and look at it
  sudo peregrine lab up --containers 2
  sudo peregrine lab status

  # run something inside a container
  sudo peregrine lab exec h1-c1 -- ping -c1 198.19.2.2

  # tune it the usual way (RPS on every stage device), then undo it
  sudo peregrine attach rps --lab
  sudo peregrine detach --lab

  sudo peregrine lab down`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.AddCommand(newLabCmd(), newAttachCmd(), newDetachCmd(), newStatusCmd(), newBenchCmd(), newReportCmd(), newAgentCmd(), newMetricsCmd(), newPdCmd(), newOptionsCmd(), newDoctorCmd(), newUninstallCmd())
	root.AddCommand(modeCommands()...)
	return root
}

// Main runs the CLI and returns the process exit code.
func Main(args []string) int {
	datapath.UseRuntime(hostRuntime())
	root := newRoot()
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "peregrine: %v\n", err)
		return 1
	}
	return 0
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// stderrLog prints progress lines for people; machines read stdout.
func stderrLog(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "  "+format+"\n", args...)
}
