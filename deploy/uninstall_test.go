package deploy

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Issue 28 item 11: deleting the agent's DaemonSet leaves the datapath on every node; the
// uninstall DaemonSet removes it. Its pod runs `peregrine uninstall --stay` with `uninstall
// --check` as readiness, with the agent's host access (the same mounts at the same places, the
// same capabilities: detach does what attach did), and its kustomization builds it alone.
// The command itself is tested on a lab by internal/agent's TestUninstallRemovesEverything.
func TestUninstallDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	decodeObject(t, "kubernetes/uninstall/daemonset.yaml", "apps/v1", "DaemonSet", &ds)
	agentDS := daemonSet(t)
	if ds.Namespace != agentDS.Namespace {
		t.Errorf("namespace %q, the agent's %q", ds.Namespace, agentDS.Namespace)
	}
	if ds.Name == agentDS.Name || ds.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == agentDS.Spec.Selector.MatchLabels["app.kubernetes.io/component"] {
		t.Errorf("the uninstall DaemonSet shares the agent's name or selector: one would adopt the other's pods")
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if got := append(slices.Clone(c.Command), c.Args...); !slices.Equal(got, []string{imageBinary, "uninstall", "--stay"}) {
		t.Errorf("the uninstall pod runs %q, want %s uninstall --stay", got, imageBinary)
	}
	if p := c.ReadinessProbe; p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command, []string{imageBinary, "uninstall", "--check"}) {
		t.Errorf("readiness %+v, want exec %s uninstall --check", p, imageBinary)
	}
	ac := agentContainer(t, agentDS)
	if c.Image != ac.Image {
		t.Errorf("image %s, the agent's %s", c.Image, ac.Image)
	}
	if !pod.HostNetwork || pod.HostPID {
		t.Error("want hostNetwork and no hostPID, as the agent")
	}
	every := false
	for _, tol := range pod.Tolerations {
		every = every || (tol.Operator == corev1.TolerationOpExists && tol.Key == "")
	}
	if !every {
		t.Error("it must run on every node the agent ran on: tolerate everything")
	}
	caps := func(c corev1.Container) []string {
		var out []string
		for _, x := range c.SecurityContext.Capabilities.Add {
			out = append(out, string(x))
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(caps(c), caps(ac)) || !slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
		t.Errorf("capabilities %v, the agent's %v (drop ALL)", caps(c), caps(ac))
	}
	mounts := func(ds *appsv1.DaemonSet, c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.HostPath != nil {
					out[m.MountPath] = v.HostPath.Path + " ro=" + map[bool]string{true: "y", false: "n"}[m.ReadOnly]
				}
			}
		}
		return out
	}
	want, got := mounts(agentDS, ac), mounts(&ds, c)
	for path, w := range want {
		if got[path] != w {
			t.Errorf("host mount %s: %q, the agent's %q", path, got[path], w)
		}
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Namespace  string   `json:"namespace"`
		Resources  []string `json:"resources"`
	}
	decodeStrict(t, "kubernetes/uninstall/kustomization.yaml", &k)
	if k.Namespace != ds.Namespace || !slices.Equal(k.Resources, []string{"daemonset.yaml"}) {
		t.Errorf("uninstall kustomization %+v", k)
	}
	if _, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command("kubectl", "kustomize", "kubernetes/uninstall").Output()
		if err != nil || !strings.Contains(string(out), "name: peregrine-uninstall") {
			t.Errorf("kubectl kustomize kubernetes/uninstall: %v\n%s", err, out)
		}
	}
}
