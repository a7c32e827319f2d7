package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// bareNetns is a network namespace with nothing in it: an agent there attaches nothing (no
// overlay to find) and runs, not ready, which is all these tests need of it.
func bareNetns(t *testing.T, short string) string {
	t.Helper()
	testutil.RequireBPF(t)
	name := fmt.Sprintf("prg-%s-%d", short, os.Getpid())
	if err := netnsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = netnsutil.Delete(name)
		for _, n := range []string{name, netnsutil.Path(name)} { // the agents' status files
			_ = safefile.Remove(StatusFile(n))
		}
	})
	return name
}

func bareConfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	writeConfig(t, p, "  rps: {}\n", freePort(t))
	return p
}

// Item 9: SIGHUP from the agent's first moments (a `systemctl reload` racing the start, a tool
// that sends SIGHUP to every peregrine) never kills it. Before, signal.Notify came after the
// config read, the checks and the listen: a SIGHUP in the first ~8 ms was fatal, and systemd
// (Type=exec) sent the reload's SIGHUP as soon as the exec was done.
//
// No program can catch a signal before its runtime installs its handlers (the first hundreds of
// microseconds after exec), so the supervisor closes that window, as each start here does: the
// even ones as systemd does (Type=notify: the reload's SIGHUP waits for READY=1, which the agent
// sends once it is started; before, it sent none), the odd ones as a supervisor without
// sd_notify would (SIGHUP ignored across the exec; the Go runtime keeps an inherited SIG_IGN of
// SIGHUP until the agent's signal.Notify) with a SIGHUP every 100 µs from the moment the
// process exists. Each agent must survive 1 s of it, still reload on the next SIGHUP (handled,
// not ignored) and stop with exit 0 on SIGTERM.
func TestAgentSurvivesSIGHUPFromItsFirstMillisecond(t *testing.T) {
	ns := bareNetns(t, "ahup")
	cfg := bareConfig(t)
	sock := filepath.Join(t.TempDir(), "notify")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	ready := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := nl.ReadFromUnix(buf)
			if err != nil {
				return
			}
			ready <- string(buf[:n])
		}
	}()
	for i := 0; i < 10; i++ {
		systemd := i%2 == 0
		cmd := exec.Command(os.Args[0], "agent", "--config", cfg, "--netns", ns)
		cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
		if !systemd {
			signal.Ignore(syscall.SIGHUP) // inherited by the child across fork and exec
		}
		p, err := testutil.StartProc(t, cmd)
		if !systemd {
			signal.Reset(syscall.SIGHUP)
		}
		if err != nil {
			t.Fatal(err)
		}
		log := p.Log
		if systemd {
			select {
			case msg := <-ready:
				if !strings.Contains(msg, "READY=1") {
					t.Fatalf("start %d: sd_notify %q, want READY=1", i, msg)
				}
			case <-p.Exited():
				t.Fatalf("start %d: the agent exited before READY=1: %v\n%s", i, p.Exit(), log.String())
			case <-time.After(10 * time.Second):
				t.Fatalf("start %d: no READY=1 on $NOTIFY_SOCKET within 10 s (systemd's Type=notify would never send the reload)\n%s", i, log.String())
			}
		}
		sent := 0
		for end := time.Now().Add(time.Second); time.Now().Before(end) && p.Alive(); sent++ {
			_ = cmd.Process.Signal(syscall.SIGHUP)
			time.Sleep(100 * time.Microsecond)
		}
		if !p.Alive() {
			t.Fatalf("start %d: the agent died under SIGHUP (%d sent): %v\n%s", i, sent, p.Exit(), log.String())
		}
		// Handled, not ignored: one more SIGHUP is one more reload.
		reloads := strings.Count(log.String(), "config re-read")
		time.Sleep(100 * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGHUP)
		deadline := time.Now().Add(5 * time.Second)
		for strings.Count(log.String(), "config re-read") <= reloads && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if strings.Count(log.String(), "config re-read") <= reloads {
			t.Errorf("start %d: a SIGHUP after the flood did not reload\n%s", i, log.String())
		}
		exited, err := p.Stop(syscall.SIGTERM, 10*time.Second)
		if !exited {
			t.Fatalf("start %d: no exit on SIGTERM\n%s", i, log.String())
		}
		if err != nil {
			t.Fatalf("start %d: exit on SIGTERM: %v\n%s", i, err, log.String())
		}
		if i < 2 {
			t.Logf("start %d (systemd %v): %d SIGHUPs in 1 s survived", i, systemd, sent)
		}
	}
}

// Item 9: two agents for one namespace started at the same moment, one of them under another
// name of it: exactly one runs; the other exits 1 at once, saying which agent holds the
// namespace. Before, both ran (the check read a status file written after the first reconcile).
func TestTwoAgentsStartedTogetherOneRuns(t *testing.T) {
	ns := bareNetns(t, "a2")
	cfg1, cfg2 := bareConfig(t), bareConfig(t)
	cmds := []*exec.Cmd{
		exec.Command(os.Args[0], "agent", "--config", cfg1, "--netns", ns),
		exec.Command(os.Args[0], "agent", "--config", cfg2, "--netns", netnsutil.Path(ns)),
	}
	var procs []*testutil.Proc
	for _, cmd := range cmds { // back to back
		p, err := testutil.StartProc(t, cmd)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	time.Sleep(3 * time.Second)
	var running, refused []*testutil.Proc
	for _, p := range procs {
		if p.Alive() {
			running = append(running, p)
		} else {
			refused = append(refused, p)
		}
	}
	if len(running) != 1 {
		t.Fatalf("%d agents run for one namespace, want exactly 1", len(running)) // their logs follow
	}
	err := refused[0].Exit()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("the second agent: %v, want exit 1", err)
	}
	msg := refused[0].Log.String()
	if !strings.Contains(msg, "another node agent manages") || !strings.Contains(msg, fmt.Sprintf("pid %d", running[0].Cmd.Process.Pid)) {
		t.Errorf("the second agent's message does not name the first (pid %d):\n%s", running[0].Cmd.Process.Pid, msg)
	}
	if exited, err := running[0].Stop(syscall.SIGTERM, 10*time.Second); !exited || err != nil {
		t.Errorf("the running agent on SIGTERM: exited %v, %v\n%s", exited, err, running[0].Log.String())
	}
}
