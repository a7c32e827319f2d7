package main

// End-to-end tests of the peregrine binary as a user runs it: exit codes, messages, and that
// nothing is left behind, also when the process is killed halfway.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// bin is built with the crash points of internal/datapath (tag peregrine_crashtest) for
// TestCrashedAttachIsRestoredByDetach; a production build has none (TestReleaseHasNoCrashPoint).
var bin string

const crashTag = "peregrine_crashtest"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "peregrine-e2e")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755) // the not-root test runs the binary as nobody
	bin = filepath.Join(dir, "peregrine")
	if out, err := exec.Command("go", "build", "-tags", crashTag, "-o", bin, ".").CombinedOutput(); err != nil {
		panic("build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs the binary and returns its exit code and combined output.
func run(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out := run(t, nil, args...)
	if code != 0 {
		t.Fatalf("peregrine %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func cleanupLab(t *testing.T, name string) {
	t.Cleanup(func() {
		run(t, nil, "detach", "--lab", "--name", name)
		run(t, nil, "lab", "down", "--name", name)
		testutil.AssertClean(t, "prg-"+name+"-")
	})
}

func TestHelpTeaches(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"lab", "up", "--help"}, {"lab", "down", "--help"},
		{"lab", "status", "--help"}, {"lab", "exec", "--help"}, {"attach", "--help"}, {"detach", "--help"}, {"status", "--help"}} {
		out := mustRun(t, args...)
		if !strings.Contains(out, "Example") && !strings.Contains(out, "Examples") {
			t.Errorf("peregrine %s has no examples:\n%s", strings.Join(args, " "), out)
		}
	}
}

// The crash-injection hook (an environment variable that makes attach exit halfway) is for tests
// only: the binary built without the tag must not contain it, the test build must.
func TestReleaseHasNoCrashPoint(t *testing.T) {
	release := filepath.Join(t.TempDir(), "peregrine")
	if out, err := exec.Command("go", "build", "-o", release, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for path, want := range map[string]bool{release: false, bin: true} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte("PEREGRINE_CRASH_AT")); got != want {
			t.Errorf("%s contains the crash hook: %v, want %v", path, got, want)
		}
	}
}

func TestBadInputIsOneLineErrorAndChangesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"lab", "up", "--name", "tbad", "--hosts", "1"}, "at least 2"},
		{[]string{"lab", "up", "--name", "tbad", "--style", "calico"}, "unknown style"},
		{[]string{"lab", "up", "--name", "tbad", "--rx-cpus", "x"}, "CPU list"},
		{[]string{"lab", "up", "--name", "tbad", "--file", "/nonexistent.yaml"}, "read topology file"},
		{[]string{"attach", "nosuchmode"}, "unknown mode"},
		{[]string{"attach", "rps", "--netns", "prg-nosuch"}, "does not exist"},
		{[]string{"lab", "exec", "--name", "tnosuch", "h1", "--", "true"}, "not up"},
	}
	for _, c := range cases {
		code, out := run(t, nil, c.args...)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("peregrine %s: exit %d, output %q; want non-zero and %q", strings.Join(c.args, " "), code, out, c.want)
		}
		if lines := strings.Count(strings.TrimSpace(out), "\n"); lines > 0 && !strings.Contains(out, "building") {
			t.Errorf("peregrine %s: error should be one line, got:\n%s", strings.Join(c.args, " "), out)
		}
	}
	testutil.AssertClean(t, "prg-tbad-")
}

func TestMalformedTopologyFile(t *testing.T) {
	testutil.RequireRoot(t)
	f := filepath.Join(t.TempDir(), "topo.yaml")
	os.WriteFile(f, []byte("style: docker\nhostz: 3\n"), 0o644)
	code, out := run(t, nil, "lab", "up", "--name", "tyaml", "--file", f)
	if code == 0 || !strings.Contains(out, "malformed") {
		t.Fatalf("typo in topology file: exit %d %q", code, out)
	}
	testutil.AssertClean(t, "prg-tyaml-")
}

func TestTopologyFileBuildsLab(t *testing.T) {
	testutil.RequireRoot(t)
	cleanupLab(t, "tyml")
	f := filepath.Join(t.TempDir(), "topo.yaml")
	os.WriteFile(f, []byte("name: tyml\nstyle: flannel\nhosts: 2\ncontainers: 2\nmtu: 1400\n"), 0o644)
	mustRun(t, "lab", "up", "--file", f)
	out := mustRun(t, "lab", "status", "--name", "tyml", "--json")
	if !strings.Contains(out, `"style": "flannel"`) || !strings.Contains(out, `"mtu": 1350`) || !strings.Contains(out, "prg-tyml-h2-c2") {
		t.Fatalf("status does not reflect the topology file:\n%s", out)
	}
}

func TestNotRootIsRefused(t *testing.T) {
	testutil.RequireRoot(t)
	for _, args := range [][]string{{"lab", "up", "--name", "tnr"}, {"attach", "rps"}} {
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "root") {
			t.Errorf("%v as nobody: err %v, output %q", args, err, out)
		}
	}
	testutil.AssertClean(t, "prg-tnr-")
}

func TestLabLifecycleAndExec(t *testing.T) {
	testutil.RequireRoot(t)
	cleanupLab(t, "tcli")
	mustRun(t, "lab", "up", "--name", "tcli", "--containers", "2")
	code, out := run(t, nil, "lab", "up", "--name", "tcli")
	if code == 0 || !strings.Contains(out, "already up") {
		t.Fatalf("second lab up: exit %d %q", code, out)
	}
	out = mustRun(t, "lab", "exec", "--name", "tcli", "h1-c1", "--", "ping", "-c", "1", "-W", "2", "198.19.2.3")
	if !strings.Contains(out, "1 received") {
		t.Fatalf("ping over the overlay failed: %s", out)
	}
	mustRun(t, "attach", "rps", "--lab", "--name", "tcli")
	code, out = run(t, nil, "attach", "rps", "--lab", "--name", "tcli")
	if code == 0 || !strings.Contains(out, "already attached") {
		t.Fatalf("second attach: exit %d %q", code, out)
	}
	if out := mustRun(t, "status"); !strings.Contains(out, "rps on prg-tcli-h1") {
		t.Fatalf("status does not show the attachment:\n%s", out)
	}
	mustRun(t, "detach", "--lab", "--name", "tcli")
	mustRun(t, "lab", "down", "--name", "tcli")
	if out := mustRun(t, "lab", "down", "--name", "tcli"); !strings.Contains(out, "nothing to remove") {
		t.Fatalf("down with nothing up: %q", out)
	}
}

// A lab up killed with SIGKILL halfway leaves namespaces; `lab down` must remove every one.
func TestKilledLabUpIsCleanedByDown(t *testing.T) {
	testutil.RequireRoot(t)
	cleanupLab(t, "tkill")
	cmd := exec.Command(bin, "lab", "up", "--name", "tkill", "--hosts", "8", "--containers", "8")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until it has built something, then kill it mid-build.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if nss, _ := netnsutil.List("prg-tkill-"); len(nss) >= 4 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if nss, _ := netnsutil.List("prg-tkill-"); len(nss) == 0 {
		t.Fatal("the killed lab up left nothing to clean: the test did not kill it halfway")
	}
	// Also leave a process running inside one namespace, as a crashed benchmark would.
	sleeper := netnsutil.Command(t.Context(), "prg-tkill-h1", "sleep", "60")
	if err := sleeper.Start(); err == nil {
		defer sleeper.Wait()
	}
	mustRun(t, "lab", "down", "--name", "tkill")
	testutil.AssertClean(t, "prg-tkill-")
}

// An attach that dies after changing knobs is undone by detach from a new process.
func TestCrashedAttachIsRestoredByDetach(t *testing.T) {
	testutil.RequireRoot(t)
	cleanupLab(t, "tcrash")
	mustRun(t, "lab", "up", "--name", "tcrash")
	path := "/sys/class/net/eth0/queues/rx-0/rps_cpus"
	before, _ := netnsutil.ReadFileIn("prg-tcrash-h1-c1", path)
	code, out := run(t, []string{"PEREGRINE_CRASH_AT=after-knobs"}, "attach", "rps", "--netns", "prg-tcrash-h1")
	if code != 99 {
		t.Fatalf("simulated crash did not happen: exit %d %s", code, out)
	}
	during, _ := netnsutil.ReadFileIn("prg-tcrash-h1-c1", path)
	if during == before {
		t.Fatal("the crashed attach had not changed the mask yet: nothing to restore")
	}
	if out := mustRun(t, "status"); !strings.Contains(out, "INCOMPLETE") {
		t.Fatalf("status should flag the interrupted attach:\n%s", out)
	}
	mustRun(t, "detach", "--netns", "prg-tcrash-h1")
	after, _ := netnsutil.ReadFileIn("prg-tcrash-h1-c1", path)
	if after != before {
		t.Fatalf("mask not restored: before %q after %q", before, after)
	}
}

// `lab down --all` removes everything with the prg- prefix, whoever made it. The test must not
// remove labs it did not create, so it runs in a sandbox: its own mount and network namespaces
// with private /run/netns, /run/peregrine, /sys and bpffs, where the labs it builds are the only
// ones. A namespace made outside beforehand proves the sandbox holds.
func TestDownAllRemovesEveryLab(t *testing.T) {
	const bystander = "prg-tbystand"
	testutil.TempNetns(t, bystander)
	script := `set -e
mkdir -p /run/netns /run/peregrine
mount -t tmpfs prg-sandbox /run/netns
mount -t tmpfs prg-sandbox /run/peregrine
mount -t sysfs sysfs /sys
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
"$BIN" lab up --name tall1 --style native >/dev/null 2>&1
"$BIN" lab up --name tall2 --style flannel >/dev/null 2>&1
"$BIN" attach rps --lab --name tall2 >/dev/null
echo "before: $(ip netns list | grep -c prg-tall) namespaces, $(ls /sys/fs/bpf/peregrine 2>/dev/null | wc -l) pin dirs, $(ls /run/peregrine/datapath | wc -l) records"
"$BIN" lab down --all >/dev/null 2>&1
echo "status: $("$BIN" status 2>&1)"
echo "left: netns[$(ip netns list)] links[$(ip -o link | grep prg- || true)] labs[$(ls -A /run/peregrine/labs)] records[$(ls /run/peregrine/datapath)] pins[$(ls -A /sys/fs/bpf/peregrine 2>/dev/null)]"
`
	cmd := exec.Command("unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "BIN="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sandboxed lab up, attach, down --all: %v\n%s", err, out)
	}
	o := string(out)
	if !strings.Contains(o, "before: 6 namespaces, 0 pin dirs, 2 records") { // rps pins nothing
		t.Fatalf("the sandbox did not hold both labs and the attachment:\n%s", o)
	}
	if !strings.Contains(o, "nothing attached") {
		t.Fatalf("down --all should forget attachments on removed namespaces:\n%s", o)
	}
	if !strings.Contains(o, "left: netns[] links[] labs[] records[] pins[]") {
		t.Fatalf("down --all left something behind:\n%s", o)
	}
	if !netnsutil.Exists(bystander) {
		t.Fatal("down --all in the sandbox removed a namespace it did not create")
	}
	testutil.AssertClean(t, "prg-tall")
}
