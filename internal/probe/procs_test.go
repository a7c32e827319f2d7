package probe

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	comm, ticks, kt, err := parseProcStat([]byte("1234 (my (odd) name) R 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 12345 0 0"))
	if err != nil || comm != "my (odd) name" || ticks != 300 || kt {
		t.Errorf("got %q %d %v %v", comm, ticks, kt, err)
	}
	_, _, kt, err = parseProcStat([]byte("17 (ksoftirqd/0) S 2 0 0 0 -1 69238848 0 0 0 0 0 920 0 0 20 0 1 0 3 0 0"))
	if err != nil || !kt {
		t.Errorf("ksoftirqd (flags 0x4208040) not a kernel thread: %v %v", kt, err)
	}
	if _, _, skip, _ := parseProcStat([]byte("99 (nginx) Z 1 99 99 0 -1 4194380 0 0 0 0 800 100 0 0 20 0 1 0 5 0 0")); !skip {
		t.Error("a zombie is not skipped")
	}
	if _, _, _, err := parseProcStat([]byte("12 (short) R 1")); err == nil {
		t.Error("short line accepted")
	}
}

func TestOtherLoadSumsByName(t *testing.T) {
	t0 := time.Unix(100, 0)
	a := ProcSnapshot{At: t0, Procs: map[int]ProcTimes{1: {"go", 100}, 2: {"go", 50}, 3: {"old", 10}}}
	b := ProcSnapshot{At: t0.Add(2 * time.Second), Procs: map[int]ProcTimes{
		1: {"go", 200},   // +1 s
		2: {"go", 150},   // +1 s
		3: {"reused", 5}, // PID reused: counts from 0
		4: {"new", 40},   // started in between
	}}
	got := OtherLoad(a, b)
	want := []ProcLoad{{"go", 1}, {"new", 0.2}, {"reused", 0.025}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Comm != want[i].Comm || !near(got[i].Cores, want[i].Cores) {
			t.Errorf("[%d] %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestOtherLoadSeesASpinner: a busy process beside us shows as about one core; our own
// process, claimed by ours, does not show.
func TestOtherLoadSeesASpinner(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	self := os.Getpid()
	ours := func(pid int) bool { return pid == self }
	a, err := TakeProcSnapshot(ours)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	b, err := TakeProcSnapshot(ours)
	if err != nil {
		t.Fatal(err)
	}
	var sh float64
	for _, l := range OtherLoad(a, b) {
		if l.Comm == "sh" {
			sh = l.Cores
		}
		if _, ok := b.Procs[self]; ok {
			t.Error("our own process was not left out")
		}
	}
	if sh < 0.3 {
		t.Errorf("the spinning sh used %.2f cores, want about 1 (at least 0.3 on a shared machine)", sh)
	}
}
