package pinned

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDoPinsTheThreadOnly(t *testing.T) {
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Skipf("no sched_getaffinity here: %v", err)
	}
	cpu := -1
	for c := range runtime.NumCPU() * 8 {
		if before.IsSet(c) {
			cpu = c
		}
	}
	if cpu < 0 {
		t.Skip("no CPU in this thread's affinity mask")
	}
	var inside unix.CPUSet
	err := Do(&cpu, "tester", func() error { return unix.SchedGetaffinity(0, &inside) })
	if err != nil {
		t.Fatal(err)
	}
	if inside.Count() != 1 || !inside.IsSet(cpu) {
		t.Errorf("inside Do the thread may run on %d CPUs, want only CPU %d", inside.Count(), cpu)
	}
	// The caller's goroutine (and so its thread) keeps the mask it had.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("caller's affinity changed from %d to %d CPUs", before.Count(), after.Count())
	}
}

func TestDoReturnsFnError(t *testing.T) {
	want := errors.New("boom")
	if err := Do(nil, "tester", func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do = %v, want fn's error", err)
	}
}

func TestDoRefusesABadCPUWithoutRunning(t *testing.T) {
	bad := 1 << 20 // beyond any CPUSet: the kernel refuses an empty mask
	ran := false
	err := Do(&bad, "tester", func() error { ran = true; return nil })
	if err == nil || !strings.Contains(err.Error(), "pin tester to CPU") {
		t.Errorf("Do on CPU %d = %v, want a pin error", bad, err)
	}
	if ran {
		t.Error("fn ran although pinning failed")
	}
}
