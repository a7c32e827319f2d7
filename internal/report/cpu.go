package report

import (
	"fmt"
	"image/color"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/peregrine-net/peregrine/internal/results"
)

// CPU categories in stacking order, bottom up: the receive-path kernel work first, idle last.
var cpuParts = []struct {
	name  string
	get   func(results.CPUShare) float64
	color color.Color
}{
	{"softirq", func(c results.CPUShare) float64 { return c.Softirq }, rgb(0xe15759)},
	{"irq", func(c results.CPUShare) float64 { return c.IRQ }, rgb(0xf28e2b)},
	{"system", func(c results.CPUShare) float64 { return c.System }, rgb(0x4e79a7)},
	{"user", func(c results.CPUShare) float64 { return c.User }, rgb(0x59a14f)},
	{"steal", func(c results.CPUShare) float64 { return c.Steal }, rgb(0x9c755f)},
	{"idle", func(c results.CPUShare) float64 { return c.Idle }, rgb(0xdddddd)},
}

// maxCPUBars: beyond this many bars a per-CPU chart is unreadable, so CPUs are summed per point.
const maxCPUBars = 48

// meanCPU averages each CPU's shares over the measured reps (a mean, not a median, so the stack
// of one CPU still sums to 1). Returns CPU index -> share, and the sorted CPU list.
func meanCPU(p *results.Point) (map[int]results.CPUShare, []int) {
	sum := map[int]results.CPUShare{}
	n := map[int]int{}
	for _, r := range p.MeasuredReps() {
		for _, c := range r.CPU {
			s := sum[c.CPU]
			s.User += c.User
			s.System += c.System
			s.IRQ += c.IRQ
			s.Softirq += c.Softirq
			s.Idle += c.Idle
			s.Steal += c.Steal
			sum[c.CPU] = s
			n[c.CPU]++
		}
	}
	var cpus []int
	for cpu, s := range sum {
		k := float64(n[cpu])
		sum[cpu] = results.CPUShare{CPU: cpu, User: s.User / k, System: s.System / k, IRQ: s.IRQ / k,
			Softirq: s.Softirq / k, Idle: s.Idle / k, Steal: s.Steal / k}
		cpus = append(cpus, cpu)
	}
	sort.Ints(cpus)
	return sum, cpus
}

// cpuBreakdown draws, for one config, a stacked bar per CPU per point (user/system/irq/softirq/
// steal/idle). Returns nil when the config has no CPU data.
func cpuBreakdown(v *view, config string) (*chart, error) {
	type group struct {
		label string
		cpu   map[int]results.CPUShare
	}
	var groups []group
	cpuSet := map[int]bool{}
	for _, pv := range v.points {
		if pv.p.Config != config {
			continue
		}
		m, cpus := meanCPU(pv.p)
		if len(cpus) == 0 {
			continue
		}
		for _, c := range cpus {
			cpuSet[c] = true
		}
		groups = append(groups, group{label: pointLabel(v, pv.p), cpu: m})
	}
	if len(groups) == 0 {
		return nil, nil
	}
	var cpus []int
	for c := range cpuSet {
		cpus = append(cpus, c)
	}
	sort.Ints(cpus)
	perCPU := len(cpus)*len(groups) <= maxCPUBars
	slots := 1 // bars per group
	if perCPU {
		slots = len(cpus)
	}
	stride := slots + 1 // an empty slot between groups
	nbars := len(groups)*stride - 1

	ylabel := "share of CPU time (%)"
	title := "receiver CPU breakdown: " + config
	if !perCPU {
		ylabel, title = "CPU time (cores, all CPUs summed)", title+" (all CPUs)"
	}
	xlabel := "CPU"
	if len(v.varying) > 0 {
		xlabel = "CPU, grouped by " + strings.Join(v.varying, ", ")
	}
	c := &chart{p: newPlot(title, xlabel, ylabel)}
	c.p.Add(hGrid())
	width := c.dataWidth() / vg.Length(nbars+1) * 0.9
	var below *plotter.BarChart
	for _, part := range cpuParts {
		vals := make(plotter.Values, nbars)
		present := false
		for g, grp := range groups {
			for i, cpu := range cpus {
				share := part.get(grp.cpu[cpu])
				if share > 0 {
					present = true
				}
				pos := g * stride
				if perCPU {
					pos += i
				}
				scale := 1.0
				if perCPU {
					scale = 100
				}
				vals[pos] += share * scale
			}
		}
		if !present {
			continue // e.g. no steal on bare metal: keep it out of the legend
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("cpu plot %s: %w", config, err)
		}
		b.Color = part.color
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		c.p.Add(b)
		c.legend = append(c.legend, legendItem{part.name, b})
	}
	// Reverse the legend so it reads top-down like the stack.
	slices.Reverse(c.legend)
	var ticks []plot.Tick
	for g, grp := range groups {
		base := float64(g * stride)
		if perCPU {
			for i, cpu := range cpus {
				ticks = append(ticks, plot.Tick{Value: base + float64(i), Label: fmt.Sprintf("cpu%d", cpu)})
			}
			if len(groups) > 1 || grp.label != "" {
				// The group's label sits on a second line under the middle of its bars.
				ticks = append(ticks, plot.Tick{Value: base + float64(slots-1)/2, Label: "\n" + grp.label})
			}
		} else {
			ticks = append(ticks, plot.Tick{Value: base, Label: grp.label})
		}
	}
	c.p.X.Tick.Marker = plot.ConstantTicks(ticks)
	c.p.X.Min, c.p.X.Max = -0.8, float64(nbars)-0.2
	c.p.Y.Min = 0
	if perCPU {
		c.p.Y.Max = 100
	}
	return c, nil
}

// pointLabel names a point by its varying X values ("64 B", "4 flows", "size=64,flows=2").
func pointLabel(v *view, p *results.Point) string {
	if len(v.varying) == 1 {
		k := v.varying[0]
		x, ok := p.X[k]
		if !ok {
			return "?"
		}
		switch k {
		case "size":
			return xLabel(k, x) + " B"
		case "flows":
			return xnum(x) + " flows"
		}
		return k + "=" + xnum(x)
	}
	sub := map[string]float64{}
	for _, k := range v.varying {
		if x, ok := p.X[k]; ok {
			sub[k] = x
		}
	}
	return results.XKey(sub)
}
