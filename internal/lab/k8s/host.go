package k8s

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// What the cluster changes outside its own namespaces, and how it is put back.

// globalSysctls are the kernel-wide knobs kubelet rewrites (protectKernelDefaults off: it has
// no mode that leaves them alone). Up saves them; Down writes them back.
var globalSysctls = []string{"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes"}

func sysctlPath(k string) string { return "/proc/sys/" + strings.ReplaceAll(k, ".", "/") }

func savedSysctls() string { return filepath.Join(StateRoot, "sysctl.saved") }

// saveSysctls writes key=value lines; an existing file (an earlier run's, not yet restored) is
// kept: it holds the machine's values, not kubelet's.
func saveSysctls() error {
	if _, err := os.Stat(savedSysctls()); err == nil {
		return nil
	}
	var b strings.Builder
	for _, k := range globalSysctls {
		v, err := os.ReadFile(sysctlPath(k))
		if err != nil {
			continue // not on this kernel
		}
		fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(savedSysctls(), []byte(b.String()), 0o600)
}

func restoreSysctls() error {
	b, err := os.ReadFile(savedSysctls())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s=%s: %w", k, v, err))
		}
	}
	if len(errs) == 0 {
		return os.Remove(savedSysctls())
	}
	return errors.Join(errs...)
}

// cgroupHierarchies are the cgroup v1 hierarchies kubelet's cgroupfs driver uses (every mounted
// one but the v2 "unified" mount), or /sys/fs/cgroup itself on a v2-only host.
func cgroupHierarchies() []string {
	var out []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if e.IsDir() && e.Name() != "unified" {
			if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		out = []string{"/sys/fs/cgroup"}
	}
	return out
}

// makeCgroupRoot creates node i's cgroupRoot in every hierarchy (kubelet requires it to exist);
// cpuset needs its cpus and mems before anything can join.
func makeCgroupRoot(i int) error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, NodeName(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, _ := os.ReadFile(filepath.Join(h, f))
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupProcs lists every process in the cluster's cgroup subtrees (pods' containers).
func cgroupProcs() []int {
	seen := map[int]bool{}
	for _, h := range cgroupHierarchies() {
		dirs, _ := filepath.Glob(filepath.Join(h, Prefix+"n*"))
		for _, d := range dirs {
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						seen[pid] = true
					}
				}
				return nil
			})
		}
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// removeCgroups removes the cluster's cgroup subtrees, deepest first.
func removeCgroups() error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		dirs, _ := filepath.Glob(filepath.Join(h, Prefix+"n*"))
		for _, d := range dirs {
			var all []string
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					all = append(all, p)
				}
				return nil
			})
			for k := len(all) - 1; k >= 0; k-- {
				if err := syscall.Rmdir(all[k]); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("cgroup %s: %w", all[k], err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// closeInheritedFDs marks every descriptor above stderr close-on-exec: the daemons outlive
// this process, and one inheriting a lock (flock's) or a pipe (go test's output) would hold it
// for their whole life. Go opens its own with O_CLOEXEC; this covers what this process was
// given by its parent.
func closeInheritedFDs() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

func numCPU() int { return runtime.NumCPU() }

// mounts lists mount points (field 5 of mountinfo) in this mount namespace.
func mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 {
			out = append(out, fs[4])
		}
	}
	return out
}

// prepareHost makes the state directory and the private mount the nodes' mount namespace
// files live on (a mount namespace can be bound only onto a non-shared mount).
func (c *Cluster) prepareHost() error {
	if err := os.MkdirAll(filepath.Join(StateRoot, "mnt"), 0o700); err != nil {
		return err
	}
	if err := saveSysctls(); err != nil {
		return err
	}
	mnt := filepath.Join(StateRoot, "mnt")
	if err := run("mount", "--bind", mnt, mnt); err != nil {
		return err
	}
	return run("mount", "--make-private", mnt)
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
