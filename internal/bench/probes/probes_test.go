package probes

import (
	"slices"
	"testing"

	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/results"
)

// A stage-probe delta becomes rows named by the testbed's stages: the backlog by its own name,
// devices outside the measured receive path and idle entries left out; a veth counted by its
// backlog queueing (RxPackets) still gets its packets.
func TestStageRowsAndNetRx(t *testing.T) {
	d := stage.Snapshot{
		Devices: []stage.DevCPU{
			{NetnsName: "prg-x-h2", Name: "eth0", CPU: 0, Counts: stage.Counts{Packets: 100, SoftirqNs: 5000}},
			{NetnsName: "prg-x-h2-c1", Name: "eth0", CPU: 1, Counts: stage.Counts{RxPackets: 90, SoftirqNs: 900}},
			{Name: stage.BacklogName, CPU: 1, Counts: stage.Counts{Packets: 90, SoftirqNs: 10}},
			{NetnsName: "prg-other-h1", Name: "eth0", CPU: 0, Counts: stage.Counts{Packets: 7, SoftirqNs: 70}},
			{NetnsName: "prg-x-h2", Name: "eth1", CPU: 0},
		},
		CPUs: []stage.CPUTotals{{CPU: 0, NetRxNs: 6000}, {CPU: 2, NetRxNs: 40}},
	}
	stages := map[string]string{"prg-x-h2/eth0": "nic", "prg-x-h2-c1/eth0": "veth", "prg-x-h2/eth1": "nic"}
	got := stageRows(d, stages)
	want := []results.StageCPU{
		{Stage: "nic", Netns: "prg-x-h2", Device: "eth0", CPU: 0, Packets: 100, SoftirqNs: 5000},
		{Stage: "veth", Netns: "prg-x-h2-c1", Device: "eth0", CPU: 1, Packets: 90, SoftirqNs: 900},
		{Stage: "backlog", Device: stage.BacklogName, CPU: 1, Packets: 90, SoftirqNs: 10},
	}
	if !slices.Equal(got, want) {
		t.Errorf("stageRows:\n got %+v\nwant %+v", got, want)
	}
	if ns := netRxNs(d); !slices.Equal(ns, []uint64{6000, 0, 40}) {
		t.Errorf("netRxNs = %v, want [6000 0 40] (indexed by CPU)", ns)
	}
	if netRxNs(stage.Snapshot{}) != nil {
		t.Error("netRxNs of nothing")
	}
}

// A set whose probes are all off starts nothing, samples nothing and closes cleanly: the costs
// of a nil probe are nil, not a crash.
func TestSetWithoutProbes(t *testing.T) {
	s := Start(nil, Options{NoStageProbe: true, NoBPFStats: true})
	if len(s.Notes) != 0 || s.costs.sample(nil) != nil || s.costs.programRuns(nil, nil, nil) != nil {
		t.Errorf("a probe-less set measured something: %+v", s)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
