// Command peregrine is fast container overlay networking on a stock Linux kernel: a lab that
// builds overlay topologies, datapath modes that attach eBPF and steering knobs, benchmarks
// and reports. Run `peregrine --help` for the tour.
package main

import (
	"os"

	"github.com/peregrine-net/peregrine/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
