package bpfstats

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

func TestSysctlFallbackRestoresPreviousValue(t *testing.T) {
	testutil.Set(t, &SysctlPath, filepath.Join(t.TempDir(), "bpf_stats_enabled"))
	for _, prev := range []string{"0", "1"} {
		if err := os.WriteFile(SysctlPath, []byte(prev+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sw, err := enableSysctl(errors.New("no BPF_ENABLE_STATS"))
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := SysctlValue(); v != "1" {
			t.Errorf("prev %s: switch reads %q while enabled, want 1", prev, v)
		}
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := sw.Close(); err != nil { // twice is harmless
			t.Fatal(err)
		}
		if v, _ := SysctlValue(); v != prev {
			t.Errorf("switch reads %q after Close, want the previous %q", v, prev)
		}
	}
}

// The fd switch counts runs while open and stops counting once closed, without touching the
// sysctl; a program's run time and count come back through Read/Delta.
func TestSwitchCountsRunsOnlyWhileOpen(t *testing.T) {
	testutil.RequireRoot(t)
	sysBefore, err := SysctlValue()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := NewCalibrationProgram()
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, _ := prog.Info()
	id, _ := info.ID()
	run := func(n int) {
		t.Helper()
		for range n {
			if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	sw, err := Enable()
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := OpenStatsFDs(); sw.How == "fd" && n != 1 {
		t.Errorf("%d stats descriptors open while enabled, want 1", n)
	}
	s0, err := Read([]ebpf.ProgramID{id})
	if err != nil {
		t.Fatal(err)
	}
	run(100)
	s1, _ := Read([]ebpf.ProgramID{id})
	d := Delta(s0, s1)
	if len(d) != 1 || d[0].Runs != 100 || d[0].RunNs == 0 || d[0].Name != CalibrationName {
		t.Fatalf("delta while enabled: %+v, want 100 runs of %s with some run time", d, CalibrationName)
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := OpenStatsFDs(); n != 0 {
		t.Errorf("%d stats descriptors open after Close", n)
	}
	if v, _ := SysctlValue(); v != sysBefore {
		t.Errorf("sysctl %q after, was %q", v, sysBefore)
	}
	if sysBefore == "0" {
		// Someone else on the machine may hold statistics on; only a quiet machine can show
		// that counting stopped.
		run(100)
		s2, _ := Read([]ebpf.ProgramID{id})
		if d := Delta(s1, s2); len(d) == 1 && d[0].Runs == 100 {
			t.Logf("runs still counted after Close: another process holds BPF statistics on")
		}
	}
}

func TestPinnedProgramsFindsProgramsAndLinks(t *testing.T) {
	testutil.RequireRoot(t)
	dir, err := os.MkdirTemp("/sys/fs/bpf", "prg-tcost-")
	if err != nil {
		t.Fatalf("no bpffs on /sys/fs/bpf: %v", err)
	}
	defer os.RemoveAll(dir)
	prog, err := NewCalibrationProgram()
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := prog.Pin(filepath.Join(dir, "sub", "p")); err != nil {
		t.Fatal(err)
	}
	ids, err := PinnedPrograms(dir)
	info, _ := prog.Info()
	want, _ := info.ID()
	if err != nil || len(ids) != 1 || ids[0] != want {
		t.Fatalf("PinnedPrograms = %v, %v; want [%d]", ids, err, want)
	}
	if ids, err := PinnedPrograms(filepath.Join(dir, "missing")); err != nil || len(ids) != 0 {
		t.Fatalf("missing dir: %v, %v", ids, err)
	}
}
