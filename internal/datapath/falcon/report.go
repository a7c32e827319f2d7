package falcon

import (
	"fmt"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Live is falcon's state as the pinned maps show it.
type Live struct {
	Config   Config
	AgentPID int
	AgentUp  bool
	Gate     Gate
	GateAge  time.Duration
	Load     map[int]uint32 // busy percent per FALCON CPU
	Stages   []StageLive
}

// StageLive is one stage transition's steering: packets per chosen CPU and per decision kind,
// since attach and over the sampling window.
type StageLive struct {
	Name   string
	ToCPU  map[int]uint64 // since attach
	Kinds  map[string]uint64
	Recent map[int]uint64 // during the window
}

// stageNames are the stages as status prints them (by StageID*).
var stageNames = []string{"vxlan", "veth"}

// ReadLive samples the maps twice, window apart, so the per-stage CPUs are the ones in use now.
func ReadLive(st *datapath.State, window time.Duration) (*Live, error) {
	cfg, err := ConfigOfState(st)
	if err != nil {
		return nil, err
	}
	o, err := openPinned(st.Target, false)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	lv := &Live{Config: cfg, AgentPID: st.AgentPID, AgentUp: agentKit.Running(st), Load: map[int]uint32{}}
	if lv.Gate, err = o.readGate(); err != nil {
		return nil, fmt.Errorf("falcon: read gate: %w", err)
	}
	if lv.Gate.UpdatedNs > 0 {
		lv.GateAge = time.Duration(monoNow() - lv.Gate.UpdatedNs)
	}
	for _, c := range cfg.CPUs {
		var v uint32
		if err := o.PrgFalconLoad.Lookup(uint32(c), &v); err == nil {
			lv.Load[c] = v
		}
	}
	before, err := readStats(o)
	if err != nil {
		return nil, err
	}
	if window > 0 {
		time.Sleep(window)
	}
	after, err := readStats(o)
	if err != nil {
		return nil, err
	}
	for s, name := range stageNames {
		sl := StageLive{Name: name, ToCPU: map[int]uint64{}, Kinds: map[string]uint64{}, Recent: map[int]uint64{}}
		for i, c := range cfg.CPUs {
			sl.ToCPU[c] = after[s*slots+i]
			sl.Recent[c] = after[s*slots+i] - before[s*slots+i]
		}
		for k := uint32(KindPass); k <= KindSticky; k++ {
			if k == KindPass {
				continue
			}
			sl.Kinds[KindName(k)] = after[s*slots+MaxCPUs+int(k)]
		}
		lv.Stages = append(lv.Stages, sl)
	}
	return lv, nil
}

// readStats sums the per-CPU counters.
func readStats(o *objects) ([]uint64, error) {
	out := make([]uint64, stages*slots)
	for i := range out {
		var per []uint64
		if err := o.PrgFalconStat.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("falcon: read stats: %w", err)
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out, nil
}

// Report is the status text.
func (mode) Report(st *datapath.State) (string, error) {
	lv, err := ReadLive(st, 300*time.Millisecond)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	c := lv.Config
	mode := "dynamic (two-choice)"
	if !c.TwoChoice {
		mode = "static (first choice only)"
	}
	fmt.Fprintf(&b, "  falcon    CPUs %v, threshold %d%% of %s load, %s, monitor every %v, re-pick after %v idle\n", c.CPUs, c.Threshold, c.loadSignal(), mode, c.Interval, c.Repick)
	if c.Split != "off" {
		active := "attached"
		if ms, err := datapath.LoadModeState[modeState](st); err == nil && len(ms.SplitPins) == 0 {
			active = "standing by (no saturated NIC core seen)"
		}
		fmt.Fprintf(&b, "            GRO split %s on CPUs %v: %s\n", c.Split, c.SplitCPUs, active)
	}
	agent := "NOT RUNNING: the gate stays where it was last written; detach and attach again"
	if lv.AgentUp {
		agent = "running"
	}
	fmt.Fprintf(&b, "  agent     pid %d %s (log %s)\n", lv.AgentPID, agent, agentKit.Log(st.Target))
	gate := "CLOSED (average load at or above threshold: stages stay on the current CPU)"
	if lv.Gate.Open {
		gate = "open (pipelining)"
	}
	fmt.Fprintf(&b, "  gate      %s, average load %d%%, epoch %d, updated %v ago\n", gate, lv.Gate.AvgPct, lv.Gate.Epoch, lv.GateAge.Round(time.Millisecond))
	var loads []string
	for _, cpu := range c.CPUs {
		mark := ""
		if lv.Load[cpu] >= uint32(c.Threshold) {
			mark = " busy"
		}
		loads = append(loads, fmt.Sprintf("cpu%d %d%%%s", cpu, lv.Load[cpu], mark))
	}
	fmt.Fprintf(&b, "  load      %s\n", strings.Join(loads, ", "))
	for _, s := range lv.Stages {
		var now, total []string
		for _, cpu := range c.CPUs {
			if s.Recent[cpu] > 0 {
				now = append(now, fmt.Sprintf("cpu%d %d pkt/s", cpu, s.Recent[cpu]*10/3))
			}
			total = append(total, fmt.Sprintf("cpu%d %d", cpu, s.ToCPU[cpu]))
		}
		if len(now) == 0 {
			now = []string{"idle"}
		}
		fmt.Fprintf(&b, "  stage %-5s now: %s; since attach: %s; decisions: first %d, second %d, sticky %d, gate-closed %d\n",
			s.Name, strings.Join(now, ", "), strings.Join(total, ", "),
			s.Kinds["first"], s.Kinds["second"], s.Kinds["sticky"], s.Kinds["gate-closed"])
	}
	return b.String(), nil
}
