// Package proc starts and stops the background programs the project runs outside its own
// process (the k8s and real flannel labs' daemons: etcd, flanneld, kubelet...) by pid file, and
// tells whether a pid still runs. A pid may be recycled once its process is gone, so nothing is
// signalled before the pid is checked to still run the program it was started as.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Gone tells whether pid has exited: no such process, or one that is a zombie (or dead) not
// yet reaped.
func Gone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses, which may itself hold ") ".
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// ReadPidFile reads a pid file; false when it is missing or unreadable, or names init or no
// pid at all.
func ReadPidFile(f string) (int, bool) {
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 1
}

// Alive tells whether the process a pid file names still runs (by pid alone: just started,
// it may still be the program that execs the named one).
func Alive(pidFile string) bool {
	pid, ok := ReadPidFile(pidFile)
	return ok && !Gone(pid)
}

// Runs tells whether pid runs (has not exited) one of progs, by its argv[0]'s base name.
func Runs(pid int, progs ...string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || Gone(pid) {
		return false
	}
	a0, _, _ := bytes.Cut(b, []byte{0})
	base := filepath.Base(string(a0))
	for _, p := range progs {
		if base == p {
			return true
		}
	}
	return false
}

// Start runs argv in the background in a session of its own (it outlives the caller), with
// env added to the caller's environment, stdin /dev/null, stdout and stderr appended to
// logFile, and its pid written to pidFile (the directories are made). The child is reaped
// when it ends.
func Start(argv, env []string, logFile, pidFile string) error {
	for _, d := range []string{filepath.Dir(logFile), filepath.Dir(pidFile)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }() // reaped when it ends (a stop, a restart, a crash)
	return os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
}

// Stop stops the process a pid file names, if it still runs one of progs (SIGTERM; SIGKILL
// after grace), and removes the file. A file naming nothing running is removed quietly.
func Stop(pidFile string, grace time.Duration, progs ...string) error {
	if pid, ok := ReadPidFile(pidFile); ok && Runs(pid, progs...) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !WaitGone(pid, grace) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !WaitGone(pid, 3*time.Second) {
				return fmt.Errorf("%s (pid %d) does not die", progs[0], pid)
			}
		}
	}
	if err := os.Remove(pidFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// WaitGone waits up to d for pid to exit and tells whether it did.
func WaitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !Gone(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// KillAll SIGKILLs pids (never init or this process) and waits for each, 2 s at most: what
// is left running in a lab's namespaces when it goes down.
func KillAll(pids []int) {
	for _, p := range pids {
		if p > 1 && p != os.Getpid() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	for _, p := range pids {
		WaitGone(p, 2*time.Second)
	}
}
