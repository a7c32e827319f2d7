package probe

import (
	"errors"
	"math"
	"testing"
	"time"
)

// Two reads of /proc/stat on a 2-CPU machine (USER_HZ 100). The per-CPU totals over the interval
// differ (131 vs 161 jiffies), and guest time is present to check that it is
// not counted twice.
const statA = `cpu  4549 0 1823 43315 785 0 89 12 7 0
cpu0 1870 0 680 22667 44 0 29 5 3 0
cpu1 2679 0 1143 20648 741 0 60 7 4 0
intr 208380 0 0 0 0
ctxt 379601
btime 1763776000
processes 5000
`

const statB = `cpu  4649 0 1853 43425 795 10 119 14 9 0
cpu0 1930 0 690 22697 44 10 49 6 4 0
cpu1 2719 0 1163 20728 751 0 70 8 5 0
intr 209380 0 0 0 0
ctxt 389601
`

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func sumStates(s Shares) float64 {
	return s.User + s.Nice + s.System + s.IRQ + s.SoftIRQ + s.Idle + s.IOWait + s.Steal
}

// checkShareInvariants asserts the properties every CPUShares must have.
func checkShareInvariants(t *testing.T, sh CPUShares) {
	t.Helper()
	var mean Shares
	busy := 0.0
	for _, c := range sh.PerCPU {
		if got := sumStates(c.Shares); math.Abs(got-1) > 1e-9 {
			t.Errorf("cpu%d: states sum to %v, want 1", c.CPU, got)
		}
		if !near(c.Busy, 1-c.Idle-c.IOWait) {
			t.Errorf("cpu%d: busy %v != 1 - idle %v - iowait %v", c.CPU, c.Busy, c.Idle, c.IOWait)
		}
		mean.add(c.Shares)
		busy += c.Busy
	}
	mean.scale(1 / float64(len(sh.PerCPU)))
	if math.Abs(mean.Busy-sh.All.Busy) > 1e-9 || math.Abs(mean.SoftIRQ-sh.All.SoftIRQ) > 1e-9 ||
		math.Abs(mean.Idle-sh.All.Idle) > 1e-9 || math.Abs(mean.User-sh.All.User) > 1e-9 {
		t.Errorf("all-CPU shares %+v are not the mean of per-CPU shares %+v", sh.All, mean)
	}
	if math.Abs(sumStates(sh.All)-1) > 1e-9 {
		t.Errorf("all-CPU states sum to %v", sumStates(sh.All))
	}
	if math.Abs(busy-sh.BusyCPUs) > 1e-9 {
		t.Errorf("busy_cpus %v, sum of per-CPU busy %v", sh.BusyCPUs, busy)
	}
}

func TestParseCPUStat(t *testing.T) {
	s := mustParse(t, ParseCPUStat, statA)
	if got := s.CPUs(); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("cpus %v", got)
	}
	want := CPUTimes{CPU: 1, User: 2679, System: 1143, Idle: 20648, IOWait: 741, SoftIRQ: 60, Steal: 7}
	if s.PerCPU[1] != want {
		t.Errorf("cpu1 = %+v, want %+v", s.PerCPU[1], want)
	}
	if s.All.CPU != -1 || s.All.User != 4549 {
		t.Errorf("aggregate = %+v", s.All)
	}
	// Guest (column 9) is inside user already: Total must not include it.
	if got := s.PerCPU[0].Total(); got != 1870+680+22667+44+29+5 {
		t.Errorf("total %d includes guest time", got)
	}
}

func TestParseCPUStatOldKernelAndErrors(t *testing.T) {
	// 2.4-era lines: only user nice system idle.
	s := mustParse(t, ParseCPUStat, "cpu 10 0 5 85\ncpu0 10 0 5 85\n")
	if s.PerCPU[0].Idle != 85 || s.PerCPU[0].IOWait != 0 {
		t.Errorf("old layout parsed as %+v", s.PerCPU[0])
	}
	assertParseFails(t, ParseCPUStat, map[string]string{
		"no cpu lines":  "intr 1 2 3\n",
		"short line":    "cpu 1 2 3\ncpu0 1 2 3\n",
		"bad number":    "cpu 1 2 3 x\ncpu0 1 2 3 4\n",
		"bad label":     "cpu 1 2 3 4\ncpuX 1 2 3 4\n",
		"duplicate cpu": "cpu 1 2 3 4\ncpu0 1 2 3 4\ncpu0 1 2 3 4\n",
	})
}

func TestCPUDelta(t *testing.T) {
	sh, err := CPUDelta(mustParse(t, ParseCPUStat, statA), mustParse(t, ParseCPUStat, statB))
	if err != nil {
		t.Fatal(err)
	}
	checkShareInvariants(t, sh)
	// cpu0: +60 user +10 sys +30 idle +10 irq +20 softirq +1 steal = 131 jiffies.
	c0 := sh.PerCPU[0]
	if c0.Jiffies != 131 {
		t.Fatalf("cpu0 jiffies %d, want 131", c0.Jiffies)
	}
	if !near(c0.User, 60.0/131) || !near(c0.SoftIRQ, 20.0/131) || !near(c0.Busy, 101.0/131) {
		t.Errorf("cpu0 shares %+v", c0.Shares)
	}
	// cpu1 has a different total (131 vs 40+20+80+10+10+1=161): All must still be the plain mean.
	if sh.PerCPU[1].Jiffies == c0.Jiffies {
		t.Fatal("fixture should have unequal per-CPU totals")
	}
	if !near(sh.All.Busy, (c0.Busy+sh.PerCPU[1].Busy)/2) {
		t.Errorf("all busy %v", sh.All.Busy)
	}
}

func TestCPUDeltaOddInput(t *testing.T) {
	a := mustParse(t, ParseCPUStat, statA)

	// Same snapshot twice: nothing accounted, shares undefined.
	if _, err := CPUDelta(a, a); !errors.Is(err, ErrEmptyInterval) {
		t.Errorf("same snapshot: err %v, want ErrEmptyInterval", err)
	}

	// A CPU went offline between the snapshots.
	b := mustParse(t, ParseCPUStat, statB)
	b.PerCPU = b.PerCPU[:1]
	if _, err := CPUDelta(a, b); !errors.Is(err, ErrCPUSetChanged) {
		t.Errorf("cpu missing: err %v, want ErrCPUSetChanged", err)
	}

	// iowait stepping back (a known tickless-kernel quirk) is clamped, not fatal.
	b = mustParse(t, ParseCPUStat, statB)
	b.PerCPU[1].IOWait = a.PerCPU[1].IOWait - 3
	sh, err := CPUDelta(a, b)
	if err != nil {
		t.Fatalf("iowait step back: %v", err)
	}
	if sh.PerCPU[1].IOWait != 0 {
		t.Errorf("iowait share %v, want 0 (clamped)", sh.PerCPU[1].IOWait)
	}
	checkShareInvariants(t, sh)
}

func TestCPUDeltaLive(t *testing.T) {
	a, err := ReadCPUStat()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
	} // burn CPU so some jiffies are user time
	b, err := ReadCPUStat()
	if err != nil {
		t.Fatal(err)
	}
	sh, err := CPUDelta(a, b)
	if err != nil {
		t.Fatal(err)
	}
	checkShareInvariants(t, sh)
	if sh.BusyCPUs <= 0 {
		t.Errorf("busy_cpus %v after spinning", sh.BusyCPUs)
	}
	t.Logf("live: %d CPUs, busy_cpus %.2f, all %+v", len(sh.PerCPU), sh.BusyCPUs, sh.All)
}
