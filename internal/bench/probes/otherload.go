package probes

import (
	"os"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/results"
)

// otherLoad records who else used the CPUs during a repetition: every user process that is not
// the benchmark itself, a peregrine agent, or a workload in one of peregrine's lab namespaces.
type otherLoad struct {
	ours   func(pid int) bool
	before probe.ProcSnapshot
	err    error
}

// otherLoadTopN is how many of the largest other processes a rep names.
const otherLoadTopN = 3

func startOtherLoad() *otherLoad {
	self := os.Getpid()
	exe, _ := os.Readlink("/proc/self/exe")
	labNs := map[uint64]bool{}
	if names, err := netnsutil.List(lab.Prefix); err == nil {
		for _, n := range names {
			if ino, err := netnsutil.Inode(netnsutil.Path(n)); err == nil {
				labNs[ino] = true
			}
		}
	}
	o := &otherLoad{ours: func(pid int) bool {
		if pid == self {
			return true
		}
		p := "/proc/" + strconv.Itoa(pid)
		if e, err := os.Readlink(p + "/exe"); err == nil && exe != "" && strings.TrimSuffix(e, " (deleted)") == exe {
			return true // an agent of ours
		}
		ino, err := netnsutil.Inode(p + "/ns/net")
		return err == nil && labNs[ino]
	}}
	o.before, o.err = probe.TakeProcSnapshot(o.ours)
	return o
}

// finish puts the other processes' CPU into rep: the total and the largest few by name.
func (o *otherLoad) finish(rep *results.Rep) {
	if o.err != nil {
		return
	}
	after, err := probe.TakeProcSnapshot(o.ours)
	if err != nil {
		return
	}
	if rep.Metrics == nil {
		rep.Metrics = map[string]float64{}
	}
	if rep.Counters == nil {
		rep.Counters = map[string]float64{}
	}
	total := 0.0
	for i, l := range probe.OtherLoad(o.before, after) {
		total += l.Cores
		if i < otherLoadTopN && l.Cores >= 0.01 {
			rep.Counters["other."+l.Comm] = l.Cores
		}
	}
	rep.Metrics[results.MetricOtherCPU] = total
}
