package ezpath

import (
	"strings"
	"testing"
)

// entriesOf gives every pair its own two entries per switch (distinct destinations).
func entriesOf(a, b string) []torEntry {
	ea, eb := endpoint{Name: a, Host: 1}, endpoint{Name: b, Host: 2}
	ea.Addr, eb.Addr = ipFor(a), ipFor(b)
	r := &rack{}
	return r.entries(ea, eb)
}

func TestPlannerOffloadsAfterKActiveIntervalsAndReturnsAfterMIdle(t *testing.T) {
	p := newPlanner(Config{Active: 3, Idle: 2, MinRate: 100, TableSize: 100})
	hot := []pairStat{{A: "h1-c1", B: "h2-c1", Rate: 1000, Class: "normal"}}
	for i := 0; i < 2; i++ {
		if pl := p.step(hot, nil, entriesOf); len(pl.Offload) != 0 {
			t.Fatalf("interval %d: offloaded before 3 active intervals", i+1)
		}
	}
	pl := p.step(hot, nil, entriesOf)
	if len(pl.Offload) != 1 {
		t.Fatalf("third active interval should offload, got %+v", pl)
	}
	on := []Pair{{A: "h1-c1", B: "h2-c1", By: "auto"}}
	cold := []pairStat{{A: "h1-c1", B: "h2-c1", Rate: 10, Class: "normal"}}
	if pl := p.step(cold, on, entriesOf); len(pl.Unoffload) != 0 {
		t.Fatal("one idle interval must not un-offload (m = 2)")
	}
	if pl := p.step(nil, on, entriesOf); len(pl.Unoffload) != 1 {
		t.Fatalf("second idle interval (no traffic at all) should un-offload, got %+v", pl)
	}
	manual := []Pair{{A: "h1-c1", B: "h2-c1", By: "manual"}}
	for i := 0; i < 5; i++ {
		if pl := p.step(nil, manual, entriesOf); len(pl.Unoffload) != 0 {
			t.Fatal("the controller must never undo a manual offload")
		}
	}
}

func TestPlannerKeepsTheBudgetAndPrefersHigherScores(t *testing.T) {
	// Table 3 -> budget 2 entries per table: one pair per switch table (each pair needs one
	// encap and one decap entry on each switch).
	p := newPlanner(Config{Active: 1, Idle: 5, MinRate: 1, TableSize: 3})
	stats := []pairStat{
		{A: "h1-c1", B: "h2-c1", Rate: 1000, Class: "normal"},
		{A: "h1-c2", B: "h2-c2", Rate: 600, Class: "high"}, // 600 x 4 beats 1000 x 1
		{A: "h1-c3", B: "h2-c3", Rate: 5000, Class: "never"},
	}
	pl := p.step(stats, nil, entriesOf)
	if len(pl.Offload) != 2 || pl.Offload[0].A != "h1-c2" {
		t.Fatalf("want the high-class pair first and both within budget 2, got %+v", pl.Offload)
	}
	if !strings.Contains(pl.Refused[pairKey("h1-c3", "h2-c3")], "never") {
		t.Fatalf("class never must stay on the overlay: %v", pl.Refused)
	}
	p2 := newPlanner(Config{Active: 1, Idle: 5, MinRate: 1, TableSize: 2}) // budget 1
	pl = p2.step(stats[:2], nil, entriesOf)
	if len(pl.Offload) != 1 || !strings.Contains(pl.Refused[pairKey("h1-c1", "h2-c1")], "budget") {
		t.Fatalf("over budget the lower score stays on the overlay, saying so: %+v", pl)
	}
}

func TestConfigBudgetAndErrors(t *testing.T) {
	for size, want := range map[int]int{1: 1, 10: 9, 1024: 921} {
		if got := (Config{TableSize: size}).Budget(); got != want {
			t.Errorf("budget of %d = %d, want %d", size, got, want)
		}
	}
	for _, bad := range []map[string]string{{}, {OptLab: "x", OptPolicy: "sometimes"}, {OptLab: "x", OptTableSize: "0"}, {OptLab: "x", OptInterval: "fast"}} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("%v should be refused", bad)
		}
	}
}

func TestDeclaredDefaults(t *testing.T) {
	c, err := ParseConfig(map[string]string{OptLab: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Drain != DefaultDrain || c.TableSize != DefaultTableSize || c.Policy != "auto" {
		t.Errorf("declared defaults %+v differ from the package's constants", c)
	}
}
