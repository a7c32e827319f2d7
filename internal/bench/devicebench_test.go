package bench

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// The device run (scripts/device-bench.sh) waits for a machine most sessions never get, so this
// smoke test runs the same script here, at 2 CPUs with the shortest durations, and keeps it from
// rotting: every step, every config, the model rows and the files the device tool brings back.

// deviceBenchSummary is the part of summary.json the test reads.
type deviceBenchSummary struct {
	Preflight string   `json:"preflight"`
	Missing   []string `json:"missing"`
	Steps     []struct {
		Step, Status string
	} `json:"steps"`
	Model []struct {
		Scenario     string   `json:"scenario"`
		Config       string   `json:"config"`
		Cores        int      `json:"cores"`
		Predicted    float64  `json:"predicted_pps"`
		Measured     float64  `json:"measured_pps"`
		Err          *float64 `json:"error"`
		ReceiveBound bool     `json:"receive_bound"`
	} `json:"model"`
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildPeregrine builds the binary the script drives (the suite's build cache makes it quick).
func buildPeregrine(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "peregrine")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/peregrine")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func readSummary(t *testing.T, dir string) deviceBenchSummary {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatalf("summary.json: %v", err)
	}
	var s deviceBenchSummary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary.json is not JSON: %v\n%s", err, b)
	}
	return s
}

func TestDeviceBenchSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("the device run needs 2 CPUs or more")
	}
	root := repoRoot(t)
	bin := buildPeregrine(t, root)
	out := t.TempDir()
	start := time.Now()
	cmd := exec.Command(filepath.Join(root, "scripts", "device-bench.sh"), "--peregrine", bin,
		"--cpus", "2", "--ns", "2", "--duration", "1", "--reps", "1", "--budget", "180", "--out", out)
	cmd.Env = append(os.Environ(), "OUT=") // the device tool's variable must not leak in
	b, err := cmd.CombinedOutput()
	t.Logf("device-bench.sh ran %s", time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("device-bench.sh: %v\n%s", err, b)
	}
	s := readSummary(t, out)
	if s.Preflight != "ok" {
		t.Fatalf("preflight %q, missing %v", s.Preflight, s.Missing)
	}
	want := []string{"tcp-n2", "udp-inject-n2", "prism-n2", "handoff-n2", "nginx-n2"}
	if len(s.Steps) != len(want) {
		t.Fatalf("steps %+v, want %v", s.Steps, want)
	}
	for i, st := range s.Steps {
		if st.Step != want[i] || st.Status != "ok" {
			t.Errorf("step %d: %s %s, want %s ok", i, st.Step, st.Status, want[i])
		}
	}
	// Every config of both throughput scenarios has the model's prediction next to a measurement.
	seen := map[string]bool{}
	for _, r := range s.Model {
		if r.Cores != 2 || r.Predicted <= 0 || r.Measured <= 0 || r.Err == nil {
			t.Errorf("model row %+v: want cores 2, a prediction, a measurement and the error", r)
		}
		seen[r.Scenario+" "+r.Config] = true
	}
	for _, sc := range []string{"tcp", "udp-inject"} {
		for _, c := range []string{"native", "flannel/vanilla", "flannel/rps", "flannel/falcon", "flannel/mflow", "flannel/fastpath", "flannel/falcon/fastpath"} {
			if !seen[sc+" "+c] {
				t.Errorf("no model row for %s %s", sc, c)
			}
		}
	}
	// What the device tool brings back: at most 8 plain files, no folders.
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("$OUT holds a folder %s: the device tool brings back files 2 levels deep at most; archive it", e.Name())
		}
		names = append(names, e.Name())
	}
	if len(names) > 8 {
		t.Errorf("$OUT holds %d files (%s): the device tool brings back 8", len(names), strings.Join(names, " "))
	}
	for _, f := range []string{"device-bench.log", "summary.json", "model.txt", "results.tar.gz"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty in $OUT", f)
		}
	}
	tar, err := exec.Command("tar", "-tzf", filepath.Join(out, "results.tar.gz")).Output()
	if err != nil || !strings.Contains(string(tar), "/html/index.html") || !strings.Contains(string(tar), "tcp-") {
		t.Errorf("results.tar.gz lacks the result JSON or the HTML report: %v\n%s", err, tar)
	}
	// The bench's labs (prg-b<pid>x<i>) and the preflight's namespace (prg-pf-<pid>) are gone.
	testutil.AssertClean(t, "prg-b")
	testutil.AssertClean(t, "prg-pf-")
}

// TestDeviceBenchPreflightStops: what a machine lacks stops the run at once, saying what, and
// nothing is measured.
func TestDeviceBenchPreflightStops(t *testing.T) {
	testutil.RequireRoot(t)
	root := repoRoot(t)
	bin := buildPeregrine(t, root)
	out := t.TempDir()
	start := time.Now()
	// One CPU cannot hold the sender apart from the receiver's IRQ core: a preflight failure.
	b, err := exec.Command(filepath.Join(root, "scripts", "device-bench.sh"), "--peregrine", bin, "--cpus", "1", "--ns", "1", "--out", out).CombinedOutput()
	if err == nil {
		t.Fatalf("device-bench.sh --cpus 1 succeeded:\n%s", b)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the preflight took %s to stop: it must stop within seconds", d)
	}
	if !strings.Contains(string(b), "MISSING at least 2 CPUs") || !strings.Contains(string(b), "nothing was measured") {
		t.Errorf("the output does not say what is missing:\n%s", b)
	}
	s := readSummary(t, out)
	if s.Preflight != "failed" || len(s.Missing) == 0 || len(s.Steps) != 0 {
		t.Errorf("summary %+v: want preflight failed, what is missing, no steps", s)
	}
	// Bad arguments change nothing and say what to do.
	b, err = exec.Command(filepath.Join(root, "scripts", "device-bench.sh"), "--cpus", "x").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(b), "--cpus x") {
		t.Errorf("--cpus x: %v, want exit 2 naming the flag:\n%s", err, b)
	}
}
