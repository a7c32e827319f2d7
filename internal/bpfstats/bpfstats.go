// Package bpfstats measures what peregrine's eBPF programs cost: it switches the kernel's BPF
// run-time statistics on for the length of a benchmark run (and restores the previous state
// after it, also when the run fails), reads each program's cumulative run time and run count,
// and attaches an empty calibration program beside them so the statistics' own overhead and the
// hook's dispatch can be netted out (DESIGN.md, "Measuring").
package bpfstats

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// SysctlPath is the global switch of the kernel's BPF run-time statistics. Holding a
// BPF_ENABLE_STATS file descriptor turns statistics on without changing what it reads.
var SysctlPath = "/proc/sys/kernel/bpf_stats_enabled"

// Switch keeps the kernel's BPF run-time statistics on until Close.
type Switch struct {
	mu     sync.Mutex
	fd     io.Closer // from BPF_ENABLE_STATS; the kernel drops it when this process dies
	prev   string    // the sysctl's value before, when the sysctl was used instead
	closed bool
	How    string // "fd" (BPF_ENABLE_STATS) or "sysctl"
}

// Enable turns the statistics on. It prefers BPF_ENABLE_STATS, whose file descriptor the kernel
// closes even if peregrine is killed, so the switch can never be left on by a crash; kernels
// before 5.8 lack it, and then the sysctl is written and Close writes the old value back.
func Enable() (*Switch, error) {
	fd, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err == nil {
		return &Switch{fd: fd, How: "fd"}, nil
	}
	return enableSysctl(err)
}

// enableSysctl is the fallback: write 1 to the sysctl, remembering what was there.
func enableSysctl(err error) (*Switch, error) {
	prev, rerr := os.ReadFile(SysctlPath)
	if rerr != nil {
		return nil, fmt.Errorf("enable BPF statistics: %v; and %s unreadable: %w", err, SysctlPath, rerr)
	}
	if werr := os.WriteFile(SysctlPath, []byte("1\n"), 0o644); werr != nil {
		return nil, fmt.Errorf("enable BPF statistics: %v; and %s: %w", err, SysctlPath, werr)
	}
	return &Switch{prev: strings.TrimSpace(string(prev)), How: "sysctl"}, nil
}

// Close restores the state found by Enable. It is safe to call more than once and on nil.
func (s *Switch) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.fd != nil {
		return s.fd.Close()
	}
	if err := os.WriteFile(SysctlPath, []byte(s.prev+"\n"), 0o644); err != nil {
		return fmt.Errorf("restore %s to %s: %w", SysctlPath, s.prev, err)
	}
	return nil
}

// SysctlValue reads the global switch ("0" or "1").
func SysctlValue() (string, error) {
	b, err := os.ReadFile(SysctlPath)
	return strings.TrimSpace(string(b)), err
}

// OpenStatsFDs counts this process's open BPF_ENABLE_STATS descriptors: a Switch left open
// shows up here (tests use it to prove the switch was given back).
func OpenStatsFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == "anon_inode:bpf-stats" {
			n++
		}
	}
	return n, nil
}

// Sample is one program's cumulative counters (or, from Delta, their increase).
type Sample struct {
	ID    ebpf.ProgramID
	Name  string // kernel name (at most 15 characters)
	Type  string // program type
	RunNs uint64 // total run time
	Runs  uint64 // run count
}

// Read samples the programs by id. A program that went away is left out (its absence in the
// later sample simply yields no delta).
func Read(ids []ebpf.ProgramID) (map[ebpf.ProgramID]Sample, error) {
	out := make(map[ebpf.ProgramID]Sample, len(ids))
	var errs []error
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("program %d: %w", id, err))
			}
			continue
		}
		s := Sample{ID: id}
		if info, err := p.Info(); err == nil {
			s.Name, s.Type = info.Name, info.Type.String()
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("program %d stats: %w", id, err))
			continue
		}
		s.RunNs, s.Runs = uint64(st.Runtime.Nanoseconds()), st.RunCount
		out[id] = s
	}
	return out, errors.Join(errs...)
}

// Delta is what each program did between two samples, for programs present in both.
func Delta(before, after map[ebpf.ProgramID]Sample) []Sample {
	var out []Sample
	for id, a := range after {
		b, ok := before[id]
		if !ok || a.Runs < b.Runs || a.RunNs < b.RunNs {
			continue
		}
		a.Runs -= b.Runs
		a.RunNs -= b.RunNs
		out = append(out, a)
	}
	return out
}
