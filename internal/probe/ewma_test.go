package probe

import (
	"errors"
	"math"
	"testing"
	"time"
)

// stat builds a CPUStat whose CPU i has spent busy[i] jiffies in user and idle[i] in idle.
func stat(busy, idle []uint64, ids ...int) CPUStat {
	var s CPUStat
	for i := range busy {
		id := i
		if ids != nil {
			id = ids[i]
		}
		s.PerCPU = append(s.PerCPU, CPUTimes{CPU: id, User: busy[i], Idle: idle[i]})
	}
	return s
}

// TestLoadSignalKernel: under the kernel signal a CPU busy with application code has room (a
// softirq runs ahead of it), one busy in system, IRQ, softirq or steal time does not.
func TestLoadSignalKernel(t *testing.T) {
	m, err := NewLoadMonitor(time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetSignal("idle"); err == nil {
		t.Error("unknown signal accepted")
	}
	if err := m.SetSignal(LoadKernel); err != nil {
		t.Fatal(err)
	}
	var a, b CPUStat
	a.PerCPU = []CPUTimes{{CPU: 0}, {CPU: 1}}
	b.PerCPU = []CPUTimes{
		{CPU: 0, User: 90, Nice: 5, SoftIRQ: 5},                         // a spinning application
		{CPU: 1, System: 20, IRQ: 10, SoftIRQ: 40, Steal: 10, User: 20}, // packet work
	}
	if err := m.Observe(a); err != nil {
		t.Fatal(err)
	}
	if err := m.Observe(b); err != nil {
		t.Fatal(err)
	}
	got := m.Current()
	if len(got) != 2 || !near(got[0], 0.05) || !near(got[1], 0.8) {
		t.Errorf("kernel loads %v, want [0.05 0.8]", got)
	}
	busy, _ := NewLoadMonitor(time.Second, 1)
	_ = busy.Observe(a)
	_ = busy.Observe(b)
	if got := busy.Current(); len(got) != 2 || !near(got[0], 1) || !near(got[1], 1) {
		t.Errorf("busy loads %v, want [1 1]", got)
	}
}

func TestLoadMonitorEWMA(t *testing.T) {
	if _, err := NewLoadMonitor(0, 0.5); err == nil {
		t.Error("zero period accepted")
	}
	for _, a := range []float64{0, -1, 1.5, math.NaN()} {
		if _, err := NewLoadMonitor(time.Second, a); err == nil {
			t.Errorf("alpha %v accepted", a)
		}
	}
	m, err := NewLoadMonitor(time.Second, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if m.Current() != nil || !math.IsNaN(m.Average(nil)) {
		t.Error("a monitor without samples reports load")
	}
	steps := []struct {
		busy, idle []uint64
		want       []float64
	}{
		{[]uint64{0, 0}, []uint64{0, 0}, nil},                         // baseline
		{[]uint64{100, 0}, []uint64{0, 100}, []float64{1, 0}},         // first interval sets the average
		{[]uint64{100, 100}, []uint64{100, 100}, []float64{0.5, 0.5}}, // cpu0 idle, cpu1 busy: halfway
		{[]uint64{150, 150}, []uint64{150, 150}, []float64{0.5, 0.5}}, // both 50 %: stays
		{[]uint64{250, 150}, []uint64{150, 250}, []float64{0.75, 0.25}},
	}
	for i, st := range steps {
		if err := m.Observe(stat(st.busy, st.idle)); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got := m.Current()
		if len(got) != len(st.want) {
			t.Fatalf("step %d: Current %v, want %v", i, got, st.want)
		}
		for c := range got {
			if !near(got[c], st.want[c]) {
				t.Errorf("step %d cpu%d: %v, want %v", i, c, got[c], st.want[c])
			}
		}
	}
	if !near(m.Average(nil), 0.5) || !near(m.Average([]int{0}), 0.75) || !near(m.Average([]int{1, 7}), 0.25) {
		t.Errorf("averages %v %v %v", m.Average(nil), m.Average([]int{0}), m.Average([]int{1, 7}))
	}
	if !math.IsNaN(m.Average([]int{7})) {
		t.Error("Average over unknown CPUs is not NaN")
	}

	// Same snapshot again: no time passed, the sample is skipped and the average kept.
	if err := m.Observe(stat([]uint64{250, 150}, []uint64{150, 250})); !errors.Is(err, ErrEmptyInterval) {
		t.Errorf("empty interval: err %v", err)
	}
	if !near(m.Current()[0], 0.75) {
		t.Error("empty interval changed the average")
	}

	// cpu1 goes offline, cpu2 appears: error, re-baseline, forget cpu1, keep cpu0.
	if err := m.Observe(stat([]uint64{300, 0}, []uint64{200, 0}, 0, 2)); !errors.Is(err, ErrCPUSetChanged) {
		t.Errorf("cpu set change: err %v", err)
	}
	if err := m.Observe(stat([]uint64{300, 100}, []uint64{300, 0}, 0, 2)); err != nil {
		t.Fatal(err)
	}
	got := m.Current()
	// cpu0: 0.5*0 + 0.5*0.75; cpu1 unknown reads 1 (never chosen as least loaded); cpu2 new: 1.
	if len(got) != 3 || !near(got[0], 0.375) || got[1] != 1 || !near(got[2], 1) {
		t.Errorf("after hotplug: %v", got)
	}
	if !near(m.Average(nil), (0.375+1)/2) {
		t.Errorf("average counts an offline CPU: %v", m.Average(nil))
	}
}

func TestLoadMonitorLive(t *testing.T) {
	m, err := NewLoadMonitor(20*time.Millisecond, 0.3)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err == nil {
		t.Error("second Start: no error")
	}
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
	}
	m.Stop()
	m.Stop() // idempotent
	cur := m.Current()
	c, _ := ReadCPUStat()
	if len(cur) != c.PerCPU[len(c.PerCPU)-1].CPU+1 {
		t.Fatalf("Current has %d entries for CPUs %v", len(cur), c.CPUs())
	}
	for i, v := range cur {
		if v < 0 || v > 1 {
			t.Errorf("cpu%d load %v outside [0,1]", i, v)
		}
	}
	if a := m.Average(nil); !(a > 0) {
		t.Errorf("average load %v while spinning one CPU", a)
	}
	if err := m.Err(); err != nil {
		t.Error(err)
	}
	t.Logf("loads %v, average %.2f", cur, m.Average(nil))
}
