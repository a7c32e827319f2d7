package k8s

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Daemons run in their node's network and mount namespace (nsenter: kubelet and containerd
// must share the mount namespace, and `ip netns exec` would give each a private one), in a
// session of their own, stdin /dev/null, stdout and stderr to <dir>/<tag>.log, pid in
// <dir>/<tag>.pid. Nothing else is passed down (closeInheritedFDs).

type execCmd = exec.Cmd

// nsenterArgs enters node i's network and mount namespaces.
func nsenterArgs(i int) []string {
	return []string{"nsenter", "--net=" + netnsutil.Path(NodeName(i)), "--mount=" + MountNS(i), "--"}
}

func nodeCommand(ctx context.Context, i int, argv ...string) *exec.Cmd {
	a := append(nsenterArgs(i), argv...)
	return exec.CommandContext(ctx, a[0], a[1:]...)
}

// start runs argv as a daemon on node i.
func (c *Cluster) start(i int, tag string, env []string, argv ...string) error {
	dir := filepath.Join(c.Dir, "logs")
	for _, d := range []string{dir, filepath.Join(c.Dir, "run")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, tag+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	a := append(nsenterArgs(i), argv...)
	cmd := exec.Command(a[0], a[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s on %s: %w", tag, NodeName(i), err)
	}
	go func() { _ = cmd.Wait() }()
	return os.WriteFile(filepath.Join(c.Dir, "run", tag+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
}

func (c *Cluster) logPath(tag string) string { return filepath.Join(c.Dir, "logs", tag+".log") }

// logTail is the end of a daemon's log, for an error message.
func (c *Cluster) logTail(tag string) string {
	b, _ := os.ReadFile(c.logPath(tag))
	s := string(b)
	if len(s) > 1500 {
		s = "..." + s[len(s)-1500:]
	}
	return fmt.Sprintf("%s (%s):\n%s", tag, c.logPath(tag), s)
}

// alive says whether the daemon tag still runs.
func (c *Cluster) alive(tag string) bool {
	pid, ok := readPid(filepath.Join(c.Dir, "run", tag+".pid"))
	return ok && !zombie(pid)
}

func readPid(f string) (int, bool) {
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 1
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, rest, _ := bytes.Cut(b, []byte(") "))
	return len(rest) > 0 && (rest[0] == 'Z' || rest[0] == 'X')
}

// stopPid stops a daemon by pid file (TERM, KILL after grace), if the pid still runs prog
// (nsenter execs it, so the pid becomes the program's; a reused pid is someone else's).
func stopPid(pidFile, prog string, grace time.Duration) error {
	pid, ok := readPid(pidFile)
	if ok && !zombie(pid) && isProg(pid, prog) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !waitGone(pid, grace) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !waitGone(pid, 3*time.Second) {
				return fmt.Errorf("%s (pid %d) does not die", prog, pid)
			}
		}
	}
	if err := os.Remove(pidFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func isProg(pid int, prog string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	a0, _, _ := bytes.Cut(b, []byte{0})
	base := filepath.Base(string(a0))
	return base == prog || base == "nsenter"
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if zombie(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return zombie(pid)
}

// killPIDs SIGKILLs pids and waits for them.
func killPIDs(pids []int) {
	for _, p := range pids {
		if p > 1 && p != os.Getpid() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	for _, p := range pids {
		waitGone(p, 2*time.Second)
	}
}

// pidsInMountNS lists processes whose mount namespace is the one bound at file.
func pidsInMountNS(file string) []int {
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		return nil
	}
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var ps syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &ps) == nil && ps.Ino == st.Ino && ps.Dev == st.Dev {
			out = append(out, pid)
		}
	}
	return out
}
