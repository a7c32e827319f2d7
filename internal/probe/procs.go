package probe

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// Other processes' CPU time during a measurement. On a shared machine a benchmark's figures
// depend on what else ran: a compile or a test suite beside it doubles per-packet costs and
// halves rates. A result records who else used the CPUs, so that a reader can tell a quiet run
// from a noisy one instead of guessing.

// userHZ is the unit of /proc/PID/stat's utime and stime (USER_HZ: 100 on every Linux port that
// exposes /proc the usual way; the kernel converts from its own HZ).
const userHZ = 100

// pfKthread is task->flags' PF_KTHREAD: kernel threads (ksoftirqd, kworkers, cpumap and NAPI
// threads) do the measured path's work and are never "other load".
const pfKthread = 0x00200000

// ProcTimes is one process's accumulated CPU time.
type ProcTimes struct {
	Comm  string
	Ticks uint64 // utime + stime, USER_HZ
}

// ProcSnapshot is the CPU time of the user processes a caller does not claim, at one instant.
type ProcSnapshot struct {
	At    time.Time
	Procs map[int]ProcTimes
}

// TakeProcSnapshot reads /proc/PID/stat of every user process for which ours returns false
// (ours may be nil: every user process counts).
func TakeProcSnapshot(ours func(pid int) bool) (ProcSnapshot, error) {
	s := ProcSnapshot{At: time.Now(), Procs: map[int]ProcTimes{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || (ours != nil && ours(pid)) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone since the listing
		}
		comm, ticks, skip, err := parseProcStat(b)
		if err != nil || skip {
			continue
		}
		s.Procs[pid] = ProcTimes{Comm: comm, Ticks: ticks}
	}
	return s, nil
}

// parseProcStat reads comm, utime+stime and whether to skip the process from a /proc/PID/stat
// line: kernel threads, and zombies (dead, not yet reaped: their namespace links are gone, so a
// caller could not tell whose they were, and the time they show was spent before). comm is in
// parentheses and may hold spaces and parentheses itself.
func parseProcStat(b []byte) (comm string, ticks uint64, skip bool, err error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, false, fmt.Errorf("probe: /proc/PID/stat without (comm)")
	}
	comm = string(b[open+1 : end])
	f := bytes.Fields(b[end+1:])
	// After comm: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime.
	if len(f) < 13 {
		return comm, 0, false, fmt.Errorf("probe: /proc/PID/stat of %q: %d fields after comm", comm, len(f))
	}
	flags, err1 := strconv.ParseUint(string(f[6]), 10, 64)
	ut, err2 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err3 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return comm, 0, false, fmt.Errorf("probe: /proc/PID/stat of %q: bad flags or times", comm)
	}
	dead := len(f[0]) == 1 && (f[0][0] == 'Z' || f[0][0] == 'X')
	return comm, ut + st, dead || flags&pfKthread != 0, nil
}

// ProcLoad is the CPU a process (or all processes of one name) used over an interval, in cores.
type ProcLoad struct {
	Comm  string  `json:"comm"`
	Cores float64 `json:"cores"`
}

// OtherLoad is what the processes in b used since a, summed by name, largest first. A process
// that started in between counts from zero; one that ended is not seen (its last slice is lost:
// sample around short intervals).
func OtherLoad(a, b ProcSnapshot) []ProcLoad {
	secs := b.At.Sub(a.At).Seconds()
	if secs <= 0 {
		return nil
	}
	by := map[string]uint64{}
	for pid, t := range b.Procs {
		prev := a.Procs[pid]
		if prev.Comm != "" && prev.Comm != t.Comm {
			prev = ProcTimes{} // the PID was reused
		}
		if t.Ticks > prev.Ticks {
			by[t.Comm] += t.Ticks - prev.Ticks
		}
	}
	out := make([]ProcLoad, 0, len(by))
	for c, ticks := range by {
		out = append(out, ProcLoad{Comm: c, Cores: float64(ticks) / userHZ / secs})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Cores != out[j].Cores {
			return out[i].Cores > out[j].Cores
		}
		return out[i].Comm < out[j].Comm
	})
	return out
}
