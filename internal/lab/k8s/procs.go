package k8s

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/proc"
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
	if err := proc.Start(append(nsenterArgs(i), argv...), env, c.logPath(tag), c.pidPath(tag)); err != nil {
		return fmt.Errorf("start %s on %s: %w", tag, NodeName(i), err)
	}
	return nil
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

func (c *Cluster) pidPath(tag string) string { return filepath.Join(c.Dir, "run", tag+".pid") }

// alive says whether the daemon tag still runs.
func (c *Cluster) alive(tag string) bool { return proc.Alive(c.pidPath(tag)) }

// stopPid stops a daemon by pid file (TERM, KILL after grace), if the pid still runs prog
// (nsenter execs it, so the pid becomes the program's; a reused pid is someone else's).
func stopPid(pidFile, prog string, grace time.Duration) error {
	return proc.Stop(pidFile, grace, prog, "nsenter")
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
