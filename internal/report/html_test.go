package report

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/resultstest"
)

func TestHTML(t *testing.T) {
	dir := t.TempDir()
	if d := os.Getenv("PEREGRINE_REPORT_DIR"); d != "" { // keep the output to look at it
		dir = d
	}
	size, flows := resultstest.SizeSweep(), resultstest.FlowSweep()
	flows.Complete, flows.Error = false, "interrupted at flows=8"
	for i := range flows.Points { // a file written without summaries must still render
		flows.Points[i].Summary = nil
	}
	index, err := HTML(dir, []*results.Run{size, flows})
	if err != nil {
		t.Fatal(err)
	}
	if index != filepath.Join(dir, IndexName) {
		t.Errorf("index = %s", index)
	}
	page, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	wantFiles := []string{
		"r1-delivered-pps-vs-size.png", "r1-throughput-bps-vs-size.png", "r1-softirqs-net-rx-count-vs-size.png",
		"r1-cpu-native-host.png", "r1-cpu-docker-vanilla.png", "r1-cpu-docker-falcon.png",
		"r1-stages-docker-vanilla.png", "r1-stages-docker-falcon.png", "r1-stages-native-host.png",
		"r2-throughput-bps-vs-flows.png",
	}
	for _, f := range wantFiles {
		checkPNG(t, filepath.Join(dir, f))
		if !strings.Contains(html, `src="`+f+`"`) {
			t.Errorf("index.html does not reference %s", f)
		}
	}
	// The flow sweep has no CPU or stage data: those charts must be skipped, not drawn empty.
	for _, f := range []string{"r2-cpu-docker-vanilla.png", "r2-stages-docker-vanilla.png", "r2-softirqs-net-rx-count-vs-flows.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s drawn without data", f)
		}
	}
	for _, want := range []string{
		"INCOMPLETE", "interrupted at flows=8", "6.18.0-fixture", "sender CPU 1, IRQ CPU 0",
		"gro on", "docker/falcon", "Ratios vs docker/vanilla", "threshold=80", "remote-sender emulation",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	if strings.Count(html, "INCOMPLETE") != 1 {
		t.Errorf("INCOMPLETE banner count = %d, want 1 (only the interrupted run)", strings.Count(html, "INCOMPLETE"))
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(html, bad) {
			t.Errorf("index.html is not self-contained: contains %q", bad)
		}
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("missing chart: %v", err)
		return
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Errorf("%s: not a PNG: %v", path, err)
		return
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: image is %dx%d", path, b.Dx(), b.Dy())
	}
}

func TestHTMLSinglePointRun(t *testing.T) {
	// One point per config: bars by config instead of lines.
	run := resultstest.FlowSweep()
	var keep []results.Point
	for _, p := range run.Points {
		if p.X["flows"] == 1 {
			keep = append(keep, p)
		}
	}
	run.Points = keep
	dir := t.TempDir()
	if d := os.Getenv("PEREGRINE_REPORT_DIR"); d != "" {
		dir = filepath.Join(d, "single")
	}
	if _, err := HTML(dir, []*results.Run{run}); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, filepath.Join(dir, "r1-throughput-bps-by-config.png"))
}

func TestCPUBreakdownManyCPUsAggregates(t *testing.T) {
	// A 16-CPU machine over 5 sizes is 80 bars: too many, so CPUs are summed per point.
	run := resultstest.SizeSweep()
	run.Env.CPUs = 16
	for i := range run.Points {
		for j := range run.Points[i].Reps {
			var cpus []results.CPUShare
			for c := range 16 {
				cpus = append(cpus, results.CPUShare{CPU: c, Softirq: 0.25, User: 0.25, Idle: 0.5})
			}
			run.Points[i].Reps[j].CPU = cpus
		}
	}
	c, err := cpuBreakdown(newView(run), resultstest.Vanilla)
	if err != nil || c == nil {
		t.Fatalf("cpuBreakdown = %v, %v", c, err)
	}
	if !strings.Contains(c.p.Title.Text, "all CPUs") || c.p.Y.Max == 100 {
		t.Errorf("expected the summed (cores) form, got title %q", c.p.Title.Text)
	}
	path := filepath.Join(t.TempDir(), "cpu.png")
	if err := c.save(path); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, path)
}
