package report

import (
	"fmt"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// stageOrder is the order a received overlay packet meets the stages (lab.Device.Stage).
var stageOrder = []string{"nic", "vxlan", "bridge", "veth-host", "veth"}

// stageCell is the work of one stage on one CPU, summed over measured reps of every point.
type stageCell struct {
	Stage   string
	CPU     int
	Packets uint64
	Ns      uint64
	Devices []string
}

// stageTotals sums a config's stage attribution over every measured rep of every point.
// The placement of a stage rarely depends on the sweep position, and one chart per config keeps
// the report readable; the JSON keeps the per-rep detail.
func stageTotals(v *view, config string) (cells []stageCell, stages []string, cpus []int) {
	type key struct {
		stage string
		cpu   int
	}
	idx := map[key]int{} // index into cells
	for _, pv := range v.points {
		if pv.p.Config != config {
			continue
		}
		for _, r := range pv.p.MeasuredReps() {
			for _, st := range r.Stages {
				k := key{st.Stage, st.CPU}
				i, ok := idx[k]
				if !ok {
					i = len(cells)
					idx[k] = i
					cells = append(cells, stageCell{Stage: st.Stage, CPU: st.CPU})
				}
				c := &cells[i]
				c.Packets += st.Packets
				c.Ns += st.SoftirqNs
				dev := st.Device
				if st.Netns != "" {
					dev = st.Netns + "/" + st.Device
				}
				if st.Device != "" && !slices.Contains(c.Devices, dev) {
					c.Devices = append(c.Devices, dev)
				}
			}
		}
	}
	stageSet, cpuSet := map[string]bool{}, map[int]bool{}
	for _, c := range cells {
		stageSet[c.Stage] = true
		cpuSet[c.CPU] = true
	}
	for _, s := range stageOrder {
		if stageSet[s] {
			stages = append(stages, s)
			delete(stageSet, s)
		}
	}
	var rest []string
	for s := range stageSet {
		rest = append(rest, s)
	}
	sort.Strings(rest)
	stages = append(stages, rest...)
	for c := range cpuSet {
		cpus = append(cpus, c)
	}
	sort.Ints(cpus)
	sort.Slice(cells, func(i, j int) bool {
		a, b := cells[i], cells[j]
		if a.Stage != b.Stage {
			return slices.Index(stages, a.Stage) < slices.Index(stages, b.Stage)
		}
		return a.CPU < b.CPU
	})
	return cells, stages, cpus
}

// stagePlacement draws, for one config, a bar per stage stacked by the CPUs that processed its
// packets (share of the stage's packets): the picture of "which core runs which stage" that
// FALCON's argument rests on. Returns nil when the config has no stage data.
func stagePlacement(v *view, config string) (*chart, error) {
	cells, stages, cpus := stageTotals(v, config)
	if len(cells) == 0 {
		return nil, nil
	}
	total := map[string]uint64{}
	for _, c := range cells {
		total[c.Stage] += c.Packets
	}
	ch := &chart{p: newPlot("receive stage placement: "+config, "receive stage (in path order)", "share of the stage's packets (%)")}
	ch.p.Add(hGrid())
	width := min(ch.dataWidth()/vg.Length(len(stages)+1)*0.6, vg.Points(80))
	var below *plotter.BarChart
	for i, cpu := range cpus {
		vals := make(plotter.Values, len(stages))
		for _, c := range cells {
			if c.CPU == cpu && total[c.Stage] > 0 {
				vals[slices.Index(stages, c.Stage)] = 100 * float64(c.Packets) / float64(total[c.Stage])
			}
		}
		var err error
		if below, err = ch.stackBar(vals, width, i, fmt.Sprintf("cpu%d", cpu), below); err != nil {
			return nil, fmt.Errorf("stage plot %s: %w", config, err)
		}
	}
	slices.Reverse(ch.legend)
	ch.p.NominalX(stages...)
	ch.p.Y.Min, ch.p.Y.Max = 0, 100
	ch.p.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 25, Label: "25"},
		{Value: 50, Label: "50"}, {Value: 75, Label: "75"}, {Value: 100, Label: "100"}}
	return ch, nil
}

// stackBar adds one segment of a stacked bar chart (colour i, on top of below) with its legend
// entry, and returns it for the next segment to stack on.
func (ch *chart) stackBar(vals plotter.Values, width vg.Length, i int, label string, below *plotter.BarChart) (*plotter.BarChart, error) {
	b, err := plotter.NewBarChart(vals, width)
	if err != nil {
		return nil, err
	}
	b.Color = colorAt(i)
	b.LineStyle.Width = 0
	if below != nil {
		b.StackOn(below)
	}
	ch.p.Add(b)
	ch.legend = append(ch.legend, legendItem{label, b})
	return b, nil
}
