package testutil

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcExitAndStop(t *testing.T) {
	p, err := StartProc(t, exec.Command("sh", "-c", "echo hello; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := p.Exit(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want status 3", err)
	}
	if p.Alive() || !strings.Contains(p.Log.String(), "hello") {
		t.Fatalf("alive %v after its exit, log %q", p.Alive(), p.Log.String())
	}

	p, err = StartProc(t, exec.Command("sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	if exited, _ := p.Wait(50 * time.Millisecond); exited || !p.Alive() {
		t.Fatal("sleep 30 exited within 50 ms")
	}
	if exited, err := p.Stop(syscall.SIGTERM, 5*time.Second); !exited || err == nil {
		t.Fatalf("SIGTERM: exited %v, %v; want exited by the signal", exited, err)
	}

	if _, err := StartProc(t, exec.Command("/nonexistent/prg-no-such-program")); err == nil {
		t.Fatal("a program that does not exist started")
	}
}

// The cleanup kills a process left running, and with Setpgid its whole group: a child it
// started is gone too.
func TestProcCleanupKillsTheGroup(t *testing.T) {
	var p *Proc
	start := time.Now()
	t.Run("owner", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		var err error
		if p, err = StartProc(t, cmd); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(5 * time.Second); !strings.Contains(p.Log.String(), "\n") && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
	})
	if p.Alive() {
		t.Fatal("the process outlived the test that started it")
	}
	// Only the shell killed, the cleanup would wait for its output pipe until the sleep ends.
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the cleanup took %v: the group's child was left running", took)
	}
	child, err := strconv.Atoi(strings.TrimSpace(p.Log.String()))
	if err != nil {
		t.Fatalf("the child's pid: %q", p.Log.String())
	}
	for end := time.Now().Add(5 * time.Second); running(child); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("the group's child %d outlived the test", child)
		}
	}
}

// running says whether pid exists and is not a zombie (killed, not yet reaped by whoever
// inherited it).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}
