package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
)

// environment describes the machine a run was measured on.
// Environment describes this machine for a result file (pd bench's results use it too).
func Environment(version string) results.Env { return environment(version) }

func environment(version string) results.Env {
	e := results.Env{Kernel: lab.KernelRelease(), CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), PeregrineVersion: version}
	e.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				if e.CPUModel == "" {
					e.CPUModel = strings.TrimSpace(v)
				}
			case "flags":
				if strings.Contains(" "+v+" ", " hypervisor ") {
					e.Virtualized = "yes (hypervisor flag)"
				}
			}
		}
	}
	return e
}
