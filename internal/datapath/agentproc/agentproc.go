// Package agentproc starts, identifies and stops the node agents of datapath modes. An agent is
// this same binary run as `peregrine agent MODE --target=NS`, detached (its own session, output
// to a log under datapath.AgentLogDir), so it outlives the CLI that attached; its PID goes in the record.
package agentproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/proc"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// env marks a process started as a mode's agent. A test binary (which is not the peregrine CLI)
// checks it in TestMain through RunIfAsked; the CLI ignores it and parses its arguments.
func env(mode string) string { return "PEREGRINE_" + strings.ToUpper(mode) + "_AGENT" }

// Log is the log file of a mode's agent for a target.
func Log(mode, target string) string { return datapath.AgentLog(mode, target) }

// Start runs the agent of mode for target, detached, and returns its PID.
func Start(mode, target string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("%s: find own binary to start the agent: %w", mode, err)
	}
	logf, err := safefile.OpenAppend(Log(mode, target)) // 0600 in a 0700 directory, no symlinks
	if err != nil {
		return 0, fmt.Errorf("%s: agent log: %w", mode, err)
	}
	defer logf.Close()
	cmd := exec.Command(exe, "agent", mode, "--target="+target)
	cmd.Env = append(os.Environ(), env(mode)+"="+target)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// A detached agent outlives us: it must not keep descriptors we inherited without
	// close-on-exec (a caller's `flock LOCK peregrine attach ...` would stay locked for as long
	// as the agent runs). Go opens its own with O_CLOEXEC; mark the rest so.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, fmt.Errorf("%s: start agent: mark inherited descriptors close-on-exec: %w", mode, err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("%s: start agent: %w", mode, err)
	}
	// Reap it if it ends while we live (tests attach and detach in one process); once we exit,
	// init adopts it.
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// Is tells whether pid is (still) the agent of mode for target, so a recycled PID is never
// signalled. A zombie has exited and is not.
func Is(pid int, mode, target string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 4 || args[1] != "agent" || args[2] != mode || args[3] != "--target="+target {
		return false
	}
	return !proc.Gone(pid)
}

// Stop asks the agent to stop (SIGTERM) and waits; SIGKILL after 3 s. Its log goes with it
// (detach leaves nothing behind; an agent that fails at start is reported from its log before).
func Stop(pid int, mode, target string) error {
	err := stop(pid, mode, target)
	if err == nil {
		_ = safefile.Remove(Log(mode, target))
	}
	return err
}

func stop(pid int, mode, target string) error {
	if !Is(pid, mode, target) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if !Is(pid, mode, target) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(50 * time.Millisecond)
	if Is(pid, mode, target) {
		return fmt.Errorf("%s: agent %d for %s does not stop", mode, pid, target)
	}
	return nil
}

// LogTail is the end of an agent's log, for error messages.
func LogTail(mode, target string) string {
	time.Sleep(100 * time.Millisecond) // let a dying agent's last words reach the file
	b, _ := safefile.ReadFile(Log(mode, target))
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

// RunIfAsked runs the agent and exits when this process was started as mode's agent. Test
// binaries that attach a mode call it first thing in TestMain (their os.Executable is the test
// binary, not the CLI).
func RunIfAsked(mode string, run func(ctx context.Context, target string) error) {
	target, ok := os.LookupEnv(env(mode))
	if !ok {
		return
	}
	if err := run(context.Background(), target); err != nil {
		fmt.Fprintf(os.Stderr, "%s agent: %v\n", mode, err)
		os.Exit(1)
	}
	os.Exit(0)
}
