package deploy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestAgentWithDaemonSetCommandLine starts the agent on a lab host with the DaemonSet
// container's arguments, unchanged, and the ConfigMap's config at the path they name; it must
// become healthy and ready on the probes' port and path, serve metrics, and on SIGTERM exit 0
// within the grace period with the datapath left attached (what makes the rolling update
// drop nothing). The ConfigMap's config differs in one key: netns names the lab host, so that
// the attachment is the lab's and lab teardown removes it (a "" target would be this machine).
//
// The agent runs as in its image: in its own mount namespace, where /etc holds only
// peregrine/config.yaml (the host's /etc is untouched), and in the lab host's network
// namespace (its hostNetwork). The binary is this repository's, built as the image builds it;
// only its path differs from the image's /peregrine.
func TestAgentWithDaemonSetCommandLine(t *testing.T) {
	testutil.RequireBPF(t)
	bin := agentBinary(t)
	ds := daemonSet(t)
	c := agentContainer(t, ds)
	argv := append(append([]string{}, c.Command...), c.Args...)
	l := labtest.Up(t, lab.Spec{Name: "tdepl", Style: lab.StyleFlannel, Containers: 1})
	h1 := labtest.NS(l, "h1")

	cfg := configMapObj(t).Data[configKey]
	if !strings.Contains(cfg, "\nnetns: \"\"\n") {
		t.Fatalf("the ConfigMap's config has no `netns: \"\"` line to point at the lab host:\n%s", cfg)
	}
	cfg = strings.Replace(cfg, "\nnetns: \"\"\n", "\nnetns: "+h1+"\n", 1)
	etc := t.TempDir()
	cfgPath := filepath.Join(configDir, configKey)
	if err := os.MkdirAll(filepath.Join(etc, filepath.Base(configDir)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, filepath.Base(configDir), configKey), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfgPath, "/etc/") || !slicesContain(argv, cfgPath) {
		t.Fatalf("the DaemonSet's command line %q does not read %s", argv, cfgPath)
	}

	proc := startAsInImage(t, h1, etc, bin, argv[1:])

	_, port := listenAddr(t)
	client := nsClient(h1)
	get := func(path string) (int, string, error) {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b), nil
	}
	wait := func(path string, within time.Duration) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			code, body, err := get(path)
			if err == nil && code == http.StatusOK {
				return body
			}
			if !proc.Alive() {
				t.Fatalf("the agent exited (%v) before %s answered 200", proc.Exit(), path)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no 200 within %v (last: %d %q %v)", path, within, code, body, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Alive by the liveness probe's first try; ready within a minute (adopting or attaching
	// fastpath on a lab takes seconds).
	wait(c.LivenessProbe.HTTPGet.Path, time.Duration(c.LivenessProbe.InitialDelaySeconds)*time.Second)
	wait(c.ReadinessProbe.HTTPGet.Path, time.Minute)
	if code, body, err := get("/metrics"); err != nil || code != 200 || !strings.Contains(body, "# TYPE") {
		t.Errorf("metrics: %d %v, body starts %q", code, err, head(body))
	}

	grace := time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	exited, err := proc.Stop(syscall.SIGTERM, grace)
	if !exited {
		t.Fatalf("the agent did not exit within the grace period (%v) of SIGTERM: the kubelet would SIGKILL it", grace)
	}
	if err != nil {
		t.Errorf("the agent exited on SIGTERM with %v, want 0", err)
	}
	states, err := datapath.LoadStates(h1)
	if err != nil || len(states) == 0 {
		t.Errorf("after SIGTERM the datapath of %s is gone (%d records, %v): an upgrade would drop it", h1, len(states), err)
	}
}

// startAsInImage starts bin with args in network namespace ns and a mount namespace of its own
// whose /etc is the directory etc (the image's /etc: peregrine/config.yaml alone). nsenter and
// unshare run before /etc is replaced; after it only bin, which is static, runs. It runs in a
// process group of its own, which the test's cleanup kills unless it exited.
func startAsInImage(t *testing.T, ns, etc, bin string, args []string) *testutil.Proc {
	t.Helper()
	script := `mount --bind "$1" /etc && shift && exec "$@"`
	all := append([]string{"--net=" + netnsutil.Path(ns), "unshare", "--mount", "--propagation", "slave", "sh", "-c", script, "sh", etc, bin}, args...)
	cmd := exec.Command("nsenter", all...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := testutil.StartProc(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nsClient is an HTTP client whose connections are made inside a network namespace.
func nsClient(ns string) *http.Client { return netnsutil.HTTPClient(ns, 5*time.Second) }

func slicesContain(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func head(s string) string {
	if len(s) > 80 {
		return s[:80] + "..." + strconv.Itoa(len(s)) + " bytes"
	}
	return s
}
