package probes

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/bpfstats"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/results"
)

// costProbe measures what every eBPF program peregrine loaded costs during a run: the kernel's
// BPF run-time statistics are on from start to close (and restored after, whatever happens),
// and each testbed gets an empty calibration program at tcx ingress of its receiving host's
// underlay device, beside the mode's programs, so their ns per run can be given net of the
// statistics' own overhead.
type costProbe struct {
	sw    *bpfstats.Switch
	probe []ebpf.ProgramID // the stage probe's programs
	calib map[*testbed.Testbed]*bpfstats.Calibration
	progs map[*testbed.Testbed][]ebpf.ProgramID // the mode's pinned programs on the testbed's hosts
	notes []string
}

// startCost switches the statistics on and attaches the calibration programs. On failure it
// returns what it undid and an error; the run then goes on without program costs.
func startCost(beds []*testbed.Testbed, sp *stage.Probe, enableStats EnableFunc) (*costProbe, error) {
	sw, err := enableStats()
	if err != nil {
		return nil, fmt.Errorf("BPF run-time statistics unavailable: %w", err)
	}
	c := &costProbe{sw: sw, calib: map[*testbed.Testbed]*bpfstats.Calibration{}, progs: map[*testbed.Testbed][]ebpf.ProgramID{}}
	if sp != nil {
		c.probe, _ = sp.ProgramIDs()
	}
	// Testbeds sharing a lab (k8s) share its receiving host: one calibration program there,
	// not one per config on the same device.
	byNs := map[string]*bpfstats.Calibration{}
	for _, tb := range beds {
		c.notes = append(c.notes, c.listPrograms(tb)...)
		ns := tb.ReceiveHostNetns()
		if ns == "" {
			continue
		}
		if cal, ok := byNs[ns]; ok {
			if cal != nil {
				c.calib[tb] = cal
			}
			continue
		}
		cal, err := bpfstats.AttachCalibration(ns, "eth0")
		byNs[ns] = cal
		if err != nil {
			c.notes = append(c.notes, fmt.Sprintf("%s: no calibration program, so no net program costs: %v", tb.Config, err))
			continue
		}
		c.calib[tb] = cal
	}
	return c, nil
}

// listPrograms finds the mode's pinned programs on the testbed's hosts.
func (c *costProbe) listPrograms(tb *testbed.Testbed) []string {
	var notes []string
	c.progs[tb] = nil
	for _, ns := range tb.Attached {
		ids, err := bpfstats.PinnedPrograms(datapath.PinDir(ns))
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: list pinned programs of %s: %v", tb.Config, ns, err))
		}
		c.progs[tb] = append(c.progs[tb], ids...)
	}
	return notes
}

// refresh lists a shared-lab testbed's programs again: its modes were attached anew for this
// repetition (new program IDs). Nil-safe.
func (c *costProbe) refresh(tb *testbed.Testbed) {
	if c == nil || !tb.IsShared() {
		return
	}
	c.listPrograms(tb)
}

// close detaches the calibration programs and restores the statistics switch. Safe on nil.
func (c *costProbe) close() error {
	if c == nil {
		return nil
	}
	var errs []error
	closed := map[*bpfstats.Calibration]bool{}
	for _, cal := range c.calib {
		if !closed[cal] {
			closed[cal] = true
			errs = append(errs, cal.Close())
		}
	}
	errs = append(errs, c.sw.Close())
	return errors.Join(errs...)
}

// ids are the programs to sample for a testbed, with their roles.
func (c *costProbe) ids(tb *testbed.Testbed) map[ebpf.ProgramID]string {
	out := map[ebpf.ProgramID]string{}
	for _, id := range c.probe {
		out[id] = results.RoleProbe
	}
	for _, id := range c.progs[tb] {
		out[id] = results.RoleDatapath
	}
	if cal := c.calib[tb]; cal != nil {
		out[cal.ID()] = results.RoleCalibration
	}
	return out
}

// sample reads the testbed's programs now (nil on a nil probe).
func (c *costProbe) sample(tb *testbed.Testbed) map[ebpf.ProgramID]bpfstats.Sample {
	if c == nil {
		return nil
	}
	ids := c.ids(tb)
	list := make([]ebpf.ProgramID, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	s, _ := bpfstats.Read(list)
	return s
}

// programRuns turns two samples into the rep's program rows, ordered by role then name.
func (c *costProbe) programRuns(tb *testbed.Testbed, before, after map[ebpf.ProgramID]bpfstats.Sample) []results.ProgramRuns {
	if c == nil {
		return nil
	}
	roles := c.ids(tb)
	var out []results.ProgramRuns
	for _, d := range bpfstats.Delta(before, after) {
		out = append(out, results.ProgramRuns{Name: d.Name, ID: uint32(d.ID), Type: d.Type, Role: roles[d.ID], Runs: d.Runs, RunNs: d.RunNs})
	}
	slices.SortFunc(out, func(a, b results.ProgramRuns) int {
		if a.Role != b.Role {
			if a.Role < b.Role {
				return -1
			}
			return 1
		}
		if a.Name != b.Name {
			if a.Name < b.Name {
				return -1
			}
			return 1
		}
		return int(a.ID) - int(b.ID)
	})
	return out
}

// netRxNs is the NET_RX softirq time per CPU, indexed by CPU.
func netRxNs(d stage.Snapshot) []uint64 {
	n := 0
	for _, c := range d.CPUs {
		n = max(n, c.CPU+1)
	}
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	for _, c := range d.CPUs {
		out[c.CPU] = c.NetRxNs
	}
	return out
}
