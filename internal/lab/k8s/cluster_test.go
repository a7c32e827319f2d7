package k8s

// End-to-end tests on a real cluster (root, PEREGRINE_TEST_ROOT=1, binaries from
// scripts/setup-k8s.sh). TestMain brings the cluster up once for the whole package, without
// peregrine; the tests below run in this file's order: churn without the agent (the
// baseline), the agent installed as users install it, then what it must keep true, and last
// the teardown that must leave the machine as it was.
//
//   flock -o /tmp/prg-heavy.lock env PEREGRINE_TEST_ROOT=1 go test -count=1 -v ./internal/lab/k8s/

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

var (
	cl         *Cluster
	upErr      error
	skipReason string
	before     *snapshot
	agentBin   string // static peregrine, image localhost/peregrine:lab
	agentBin2  string // the same with another version string, image localhost/peregrine:lab2
	repoRoot   string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	switch {
	case os.Getenv("PEREGRINE_TEST_ROOT") == "":
		skipReason = "set PEREGRINE_TEST_ROOT=1 (as root) to bring up the real cluster"
	case os.Geteuid() != 0:
		skipReason = "needs root"
	default:
		if miss := DefaultBinaries().Missing(); len(miss) > 0 {
			// PEREGRINE_TEST_ROOT asks for every test: a missing binary fails, it does not skip.
			upErr = fmt.Errorf("k8s lab binaries missing (run scripts/setup.sh): %s", strings.Join(miss, "; "))
			return m.Run()
		}
	}
	if skipReason != "" {
		return m.Run()
	}
	repoRoot, _ = filepath.Abs("../../..")
	tmp, err := os.MkdirTemp("", "prg-k8s-test")
	if err != nil {
		log.Print(err)
		return 1
	}
	defer os.RemoveAll(tmp)
	t0 := time.Now()
	agentBin, agentBin2 = filepath.Join(tmp, "peregrine"), filepath.Join(tmp, "peregrine2")
	for _, b := range []struct{ out, version string }{{agentBin, "lab"}, {agentBin2, "lab2"}} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/peregrine-net/peregrine/internal/cli.Version="+b.version,
			"-o", b.out, "./cmd/peregrine")
		cmd.Dir, cmd.Env = repoRoot, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			log.Printf("build the agent: %v\n%s", err, out)
			return 1
		}
	}
	log.Printf("agent binaries built in %s", time.Since(t0).Round(time.Second))
	before = takeSnapshot()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t1 := time.Now()
	cl, upErr = Up(ctx, Spec{Nodes: 2, NetworkPolicy: true, AgentBinary: agentBin, Repo: repoRoot}, log.Printf)
	log.Printf("cluster up in %s (err %v)", time.Since(t1).Round(100*time.Millisecond), upErr)
	code := m.Run()
	if err := Down(log.Printf, datapath.ForgetNamespaces); err != nil {
		log.Printf("down: %v", err)
		code = 1
	}
	return code
}

func need(t *testing.T) *Cluster {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if upErr != nil {
		t.Fatalf("the cluster did not come up: %v", upErr)
	}
	if cl == nil {
		t.Fatal("the cluster was removed by an earlier test")
	}
	return cl
}

func tctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func kubectl(t *testing.T, c *Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(tctx(t, 2*time.Minute), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func apply(t *testing.T, c *Cluster, yaml string) {
	t.Helper()
	if _, err := c.KubectlIn(tctx(t, time.Minute), yaml, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// TestK8sUp: what lab up promised holds: every node Ready, every daemon running, the test
// workloads answering (Verify: pod to pod on a node and across VXLAN, pod to ClusterIP).
func TestK8sUp(t *testing.T) {
	c := need(t)
	ctx := tctx(t, time.Minute)
	if err := c.Healthy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	// NodePort: from node 2's own namespace to node 1's address.
	out, err := httpGetIn(NodeName(2), fmt.Sprintf("%s:%d", nodeAddr(1), WebNodePort))
	if err != nil || !strings.HasPrefix(out, "web-") {
		t.Fatalf("NodePort %s:%d from %s: %v: %q", nodeAddr(1), WebNodePort, NodeName(2), err, out)
	}
}
