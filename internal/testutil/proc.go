package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Proc is a child process a test started and owns: its output goes to Log; when the test ends
// it is killed unless it exited (its whole process group when cmd asked for one of its own, so
// that nothing it started outlives the test), and its log is shown when the test failed.
type Proc struct {
	Cmd  *exec.Cmd
	Log  *SyncBuffer
	done chan struct{}
	err  error // the exit: valid once done is closed
}

// StartProc starts cmd with its output in the Proc's Log and registers the cleanup. The error
// is cmd.Start's: the caller says what failed (and may undo what it set up for the start, such
// as a signal disposition the child inherits) before it fails the test.
func StartProc(t testing.TB, cmd *exec.Cmd) (*Proc, error) {
	t.Helper()
	p := &Proc{Cmd: cmd, Log: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if p.Alive() {
			if a := cmd.SysProcAttr; a != nil && a.Setpgid {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			} else {
				_ = cmd.Process.Kill()
			}
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s (pid %d) log:\n%s", filepath.Base(cmd.Path), cmd.Process.Pid, p.Log.String())
		}
	})
	return p, nil
}

// Alive says whether the process has not exited yet.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// Exit waits for the process to exit and returns how it exited (cmd.Wait's error: nil for
// status 0); once Alive is false it returns at once.
func (p *Proc) Exit() error {
	<-p.done
	return p.err
}

// Wait waits at most d for the process to exit: exited is false when it still runs, else exit
// is how it exited (cmd.Wait's error: nil for status 0).
func (p *Proc) Wait(d time.Duration) (exited bool, exit error) {
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(d):
		return false, nil
	}
}

// Stop sends sig and waits at most d for the exit, as Wait.
func (p *Proc) Stop(sig os.Signal, d time.Duration) (exited bool, exit error) {
	_ = p.Cmd.Process.Signal(sig)
	return p.Wait(d)
}
