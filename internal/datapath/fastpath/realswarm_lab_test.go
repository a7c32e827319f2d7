package fastpath

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// nsRun runs argv in the network namespace whose file is path (a container's SandboxKey), in
// this mount namespace: the host's iperf3 and ss serve a busybox container.
func nsRun(t *testing.T, path string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + path, "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", path, strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// swarmLeftovers lists what the swarm lab NAME may leave outside its namespaces: its directory
// under /run, processes started from it, mounts under it.
func swarmLeftovers(name string) []string {
	var out []string
	dirs, _ := filepath.Glob("/run/prg-" + name + "-n*")
	out = append(out, dirs...)
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), "/run/prg-"+name+"-n") {
			out = append(out, "process "+filepath.Base(filepath.Dir(p))+" "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if fs := strings.Fields(s.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], "/run/prg-"+name+"-n") {
				out = append(out, "mount "+fs[4])
			}
		}
	}
	return out
}

// hostRuleset is the host namespace's netfilter rules, which no node's dockerd may touch.
func hostRuleset(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v\n%s", err, out)
	}
	return string(out)
}

// TestRealDockerSwarmOverlay attaches the fast path to a real docker swarm overlay
// (scripts/real-docker-overlay.sh: Debian's docker.io, one dockerd per node namespace, swarm's
// ingress overlay VNI 4096 and an attachable user overlay VNI 4097, busybox containers on it),
// checks TCP and ICMP between containers on the two nodes take the fast path of the user
// overlay on both nodes, that a container started after attach is in status within a second and
// on the fast path, detaches, and checks the teardown leaves nothing, also on failure.
func TestRealDockerSwarmOverlay(t *testing.T) {
	testutil.RequireRoot(t)
	for _, f := range []string{"/usr/sbin/dockerd", "/usr/bin/docker", "/usr/bin/containerd", "/bin/busybox"} {
		if _, err := os.Stat(f); err != nil {
			// scripts/test.sh runs setup.sh, which installs both: there a missing one is a
			// broken machine, not a reason to pass.
			if os.Getenv(testutil.RootEnv) == "1" {
				t.Fatalf("docker.io or busybox-static not installed (%s missing): scripts/setup.sh installs them", f)
			}
			t.Skipf("docker.io or busybox-static not installed (%s missing): run scripts/setup.sh (or scripts/setup-docker.sh)", f)
		}
	}
	const name = "fsw"
	rules := hostRuleset(t)
	start := time.Now()
	_, nodes, out := labtest.ScriptLab(t, "../../../scripts/real-docker-overlay.sh", name, 2, func() {
		if left := swarmLeftovers(name); len(left) > 0 {
			t.Errorf("left behind by the swarm lab: %s", strings.Join(left, "; "))
		}
		if now := hostRuleset(t); now != rules {
			t.Errorf("the host's netfilter rules changed:\nbefore:\n%s\nafter:\n%s", rules, now)
		}
	})
	t.Logf("swarm lab up in %.1f s", time.Since(start).Seconds())
	lab := map[string]string{} // info's KEY=value lines
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.Contains(k, " ") {
			lab[k] = strings.TrimSpace(v)
		}
	}
	if lab["VNIS"] != "4096 4097" {
		t.Fatalf("VNIs (ingress, user overlay) = %q, want \"4096 4097\"\n%s", lab["VNIS"], out)
	}
	c1, c2, dst := lab["N1_C1_NETNS"], lab["N2_C1_NETNS"], lab["N2_C1_IP"]
	if c1 == "" || c2 == "" || dst == "" {
		t.Fatalf("info lacks a container's namespace or address:\n%s", out)
	}
	if strings.Contains(hostRuleset(t), "DOCKER") {
		t.Fatal("a node's dockerd wrote rules into the host namespace")
	}

	for _, h := range nodes {
		if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{}); err != nil {
			t.Fatalf("attach %s (no --underlay: discovery must find eth0 behind docker's vxlan0): %v", h, err)
		}
	}
	nsRun(t, c1, "ping", "-c", "5", "-i", "0.1", "-w", "5", dst)
	nsRun(t, c2, "iperf3", "-s", "-D", "-1", "-p", "5307")
	waitListeningAt(t, c2, 5307)
	nsRun(t, c1, "iperf3", "-c", dst, "-p", "5307", "-t", "1")

	for _, h := range nodes {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range v.Overlays {
			t.Logf("%s: serves VNI %d on %s over %s", h, o.VNI, o.VXLAN, o.Underlay)
		}
		// The transfer crossed the user overlay: both directions on the fast path on each node.
		user := overlayOf(t, v, 4097)
		if user.Egress["hit"] == 0 || user.Ingress["hit"] == 0 || user.Underlay != h+"/eth0" {
			t.Fatalf("%s: user overlay %s: egress hits %d, ingress hits %d, underlay %s\n%s",
				h, user.VXLAN, user.Egress["hit"], user.Ingress["hit"], user.Underlay, v.Format())
		}
		t.Logf("%s: VNI 4097 on %s: egress hit %d miss %d, ingress hit %d miss %d, %d flows",
			h, user.VXLAN, user.Egress["hit"], user.Egress["miss"], user.Ingress["hit"], user.Ingress["miss"], user.Flows)
	}

	// A container started after attach: in status within a second of docker run returning, and
	// its traffic on the fast path.
	docker2 := []string{"-H", "unix://" + lab["N2_SOCK"]}
	if out, err := exec.Command("/usr/bin/docker", append(docker2, "run", "-d", "--pull", "never",
		"--name", "prg-fsw-n2-c9", "--network", "prg-ov", "--ip", "10.252.0.29", "prg-busybox:1", "sleep", "86400")...).CombinedOutput(); err != nil {
		t.Fatalf("docker run on node 2: %v\n%s", err, out)
	}
	added := time.Now()
	labtest.Eventually(t, time.Second, "the new container in node 2's status", func() (bool, string) {
		v, err := Inspect(nodes[1])
		if err != nil {
			return false, err.Error()
		}
		return hasPod(overlayOf(t, v, 4097), "10.252.0.29"), v.Format()
	})
	t.Logf("new container in status %.0f ms after docker run returned", time.Since(added).Seconds()*1000)
	v0, err := Inspect(nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	nsRun(t, c1, "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.252.0.29")
	v1, err := Inspect(nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	if o0, o1 := overlayOf(t, v0, 4097), overlayOf(t, v1, 4097); o1.Egress["hit"] <= o0.Egress["hit"] || o1.Ingress["hit"] <= o0.Ingress["hit"] {
		t.Fatalf("pings to the new container took no fast path on node 2: egress hits %d -> %d, ingress %d -> %d",
			o0.Egress["hit"], o1.Egress["hit"], o0.Ingress["hit"], o1.Ingress["hit"])
	}
	labtest.DetachGone(t, Name, nodes...)
	// The overlay still works on the normal path.
	nsRun(t, c1, "ping", "-c", "2", "-i", "0.1", "-w", "5", dst)
	if d := time.Since(start); d > 90*time.Second {
		t.Errorf("took %.0f s, the budget is 90 s", d.Seconds())
	}
}

// waitListeningAt waits for a TCP listener on port in the namespace file path.
func waitListeningAt(t *testing.T, path string, port int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(nsRun(t, path, "ss", "-Htln"), fmt.Sprintf(":%d ", port)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %d in %s", port, path)
}
