package proc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A program started by Start runs in the background with its pid file; Stop ends it (SIGTERM)
// and removes the file; a pid file whose pid runs another program is removed without any
// signal; KillAll ends what it is given.
func TestStartStop(t *testing.T) {
	d := t.TempDir()
	logf, pidf := filepath.Join(d, "logs", "s.log"), filepath.Join(d, "run", "s.pid")
	if err := Start([]string{"sh", "-c", `echo "up $PRG_X"; exec sleep 30`}, []string{"PRG_X=1"}, logf, pidf); err != nil {
		t.Fatal(err)
	}
	pid, ok := ReadPidFile(pidf)
	if !ok || !Alive(pidf) {
		t.Fatalf("pid file %q: %d %v", pidf, pid, ok)
	}
	t.Cleanup(func() { KillAll([]int{pid}) })
	deadline := time.Now().Add(5 * time.Second)
	for !Runs(pid, "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("the program never became sleep")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b, _ := os.ReadFile(logf); !strings.Contains(string(b), "up 1") {
		t.Fatalf("log %q: want the program's output with its environment", b)
	}

	other := filepath.Join(d, "other.pid")
	if err := os.WriteFile(other, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Stop(other, time.Second, "etcd"); err != nil {
		t.Fatal(err)
	}
	if Gone(pid) {
		t.Fatal("a pid running another program was signalled")
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatal("the stale pid file stayed")
	}

	if err := Stop(pidf, 3*time.Second, "sleep"); err != nil {
		t.Fatal(err)
	}
	if !WaitGone(pid, time.Second) || Alive(pidf) {
		t.Fatal("Stop left the program running or its pid file")
	}
	if err := Stop(pidf, time.Second, "sleep"); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}

	if _, ok := ReadPidFile(filepath.Join(d, "none.pid")); ok {
		t.Fatal("a missing pid file read as a pid")
	}
	bad := filepath.Join(d, "bad.pid")
	_ = os.WriteFile(bad, []byte("1\n"), 0o600)
	if _, ok := ReadPidFile(bad); ok {
		t.Fatal("pid 1 read as a daemon's")
	}
}
