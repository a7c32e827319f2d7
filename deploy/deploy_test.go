// Package deploy holds peregrine's deployment artifacts (Containerfile, Kubernetes manifests,
// systemd unit) and the tests that keep them true to the agent: the manifests decode strictly
// into the Kubernetes API types, and their command line, probes, mounts and config match the
// agent's contract (notes: peregrine agent --config FILE, /healthz and /readyz on `listen`).
// The package has only tests, so the Kubernetes modules never reach the binary.
package deploy

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The agent's contract, as the deployment must use it.
var (
	agentArgs    = []string{"agent", "--config", "/etc/peregrine/config.yaml"}
	imageBinary  = "/peregrine"
	hostBinary   = "/usr/local/bin/peregrine"
	configDir    = "/etc/peregrine"
	configKey    = "config.yaml"
	configMap    = "peregrine-config"
	capabilities = []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_CHROOT"}
	// Host paths the agent needs, and the propagation each needs (HostToContainer: mounts the
	// host makes later must show, as a new pod's namespace does under /var/run/netns).
	hostMounts = map[string]corev1.MountPropagationMode{
		"/sys/fs/bpf":    corev1.MountPropagationHostToContainer,
		"/run/peregrine": "",
		"/var/run/netns": corev1.MountPropagationHostToContainer,
		"/sys":           "",
	}
	// Host paths the agent writes under (records, pins, rps knobs).
	writable = []string{"/sys/fs/bpf", "/run/peregrine", "/sys"}
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeStrict decodes one manifest into its API type, refusing unknown and duplicate fields.
func decodeStrict(t *testing.T, path string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(read(t, path), into); err != nil {
		t.Fatalf("%s does not decode strictly into %T: %v", path, into, err)
	}
}

// decodeObject is decodeStrict for a Kubernetes object, which must also say it is apiVersion/kind.
func decodeObject(t *testing.T, path, apiVersion, kind string, into any) {
	t.Helper()
	decodeStrict(t, path, into)
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(read(t, path), &tm); err != nil {
		t.Fatal(err)
	}
	if tm.APIVersion != apiVersion || tm.Kind != kind {
		t.Fatalf("%s is %s %s, want %s %s", path, tm.APIVersion, tm.Kind, apiVersion, kind)
	}
}

func daemonSet(t *testing.T) *appsv1.DaemonSet {
	var ds appsv1.DaemonSet
	decodeObject(t, "kubernetes/daemonset.yaml", "apps/v1", "DaemonSet", &ds)
	return &ds
}

func configMapObj(t *testing.T) *corev1.ConfigMap {
	var cm corev1.ConfigMap
	decodeObject(t, "kubernetes/configmap.yaml", "v1", "ConfigMap", &cm)
	return &cm
}

func agentContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("the DaemonSet has %d containers, want the agent alone", len(cs))
	}
	return cs[0]
}

// TestStrictDecodeRefusesUnknownFields proves the decoding below would catch a typo: the same
// manifest with one misspelt field is refused.
func TestStrictDecodeRefusesUnknownFields(t *testing.T) {
	b := read(t, "kubernetes/daemonset.yaml")
	bad := bytes.Replace(b, []byte("      hostNetwork: true"), []byte("      hostNetwrok: true"), 1)
	if bytes.Equal(b, bad) {
		t.Fatal("daemonset.yaml has no hostNetwork line to misspell")
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(bad, &ds); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Fatalf("a misspelt field was not refused (err %v)", err)
	}
}

func TestManifestsDecode(t *testing.T) {
	ds := daemonSet(t)
	cm := configMapObj(t)
	var sa corev1.ServiceAccount
	decodeObject(t, "kubernetes/serviceaccount.yaml", "v1", "ServiceAccount", &sa)
	for _, m := range []struct{ what, ns string }{{"DaemonSet", ds.Namespace}, {"ConfigMap", cm.Namespace}, {"ServiceAccount", sa.Namespace}} {
		if m.ns != ds.Namespace || m.ns == "" {
			t.Errorf("%s is in namespace %q, the DaemonSet in %q: they must share one", m.what, m.ns, ds.Namespace)
		}
	}
	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("the pod runs as %q, the manifest defines %q", pod.ServiceAccountName, sa.Name)
	}
	if cm.Name != configMap {
		t.Errorf("the ConfigMap is %q, the contract names %q", cm.Name, configMap)
	}
	sel := ds.Spec.Selector.MatchLabels
	if len(sel) == 0 {
		t.Fatal("the DaemonSet selects no labels")
	}
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels %v", k, v, ds.Spec.Template.Labels)
		}
	}
}

// TestKustomization: the kustomization lists every manifest of the directory, once, and puts
// them in the namespace they name themselves.
func TestKustomization(t *testing.T) {
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Namespace  string   `json:"namespace"`
		Resources  []string `json:"resources"`
	}
	decodeStrict(t, "kubernetes/kustomization.yaml", &k)
	if k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml is a %q", k.Kind)
	}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	got := slices.Clone(k.Resources)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, the directory has %v", got, want)
	}
	if ds := daemonSet(t); k.Namespace != ds.Namespace {
		t.Errorf("kustomization namespace %q, manifests %q", k.Namespace, ds.Namespace)
	}
	// What `kubectl apply -k` would send, where kubectl (with its built-in kustomize) is here.
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Log("kubectl is not installed: the kustomize build is not checked")
		return
	}
	out, err := exec.Command("kubectl", "kustomize", "kubernetes").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	kinds := map[string]int{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("kustomize output: %v", err)
		}
		var obj any
		switch meta.Kind {
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		default:
			t.Fatalf("kustomize output has a %q", meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("kustomize's %s does not decode strictly: %v", meta.Kind, err)
		}
		kinds[meta.Kind]++
	}
	if len(kinds) != 3 || kinds["DaemonSet"] != 1 || kinds["ConfigMap"] != 1 || kinds["ServiceAccount"] != 1 {
		t.Errorf("kustomize built %v, want one DaemonSet, ConfigMap and ServiceAccount", kinds)
	}
}

func TestDaemonSetCommandAndConfig(t *testing.T) {
	ds := daemonSet(t)
	c := agentContainer(t, ds)
	want := append([]string{imageBinary}, agentArgs...)
	if got := append(slices.Clone(c.Command), c.Args...); !slices.Equal(got, want) {
		t.Errorf("the container runs %q, the contract's command line is %q", got, want)
	}
	// The config directory comes from the ConfigMap, mounted whole (a subPath mount would never
	// see an edit).
	var vol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == configDir {
			vol = m.Name
			if m.SubPath != "" || m.SubPathExpr != "" {
				t.Errorf("%s is mounted with a subPath: ConfigMap updates would not reach the agent", configDir)
			}
		}
	}
	v := volume(t, ds, vol)
	if v == nil || v.ConfigMap == nil || v.ConfigMap.Name != configMap {
		t.Fatalf("%s is not mounted from ConfigMap %s (volume %q: %+v)", configDir, configMap, vol, v)
	}
	if len(v.ConfigMap.Items) > 0 {
		t.Errorf("the config volume selects items %v: the agent reads %s, keep the key's own name", v.ConfigMap.Items, configKey)
	}
	if _, ok := configMapObj(t).Data[configKey]; !ok {
		t.Errorf("the ConfigMap has no key %s", configKey)
	}
}

func volume(t *testing.T, ds *appsv1.DaemonSet, name string) *corev1.Volume {
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return &ds.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}

// listenAddr is the ConfigMap config's listen address, split.
func listenAddr(t *testing.T) (host string, port int) {
	cfg := decodeConfig(t, []byte(configMapObj(t).Data[configKey]))
	l, _ := cfg["listen"].(string)
	h, p, err := net.SplitHostPort(l)
	if err != nil {
		t.Fatalf("config listen %q: %v", l, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		t.Fatalf("config listen %q: bad port", l)
	}
	return h, port
}

func TestDaemonSetProbesAndScrape(t *testing.T) {
	ds := daemonSet(t)
	c := agentContainer(t, ds)
	host, port := listenAddr(t)
	loopback := host == "localhost" || (net.ParseIP(host) != nil && net.ParseIP(host).IsLoopback())
	for _, p := range []struct {
		what, path string
		probe      *corev1.Probe
	}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.what)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s probe asks %s, the agent serves %s", p.what, g.Path, p.path)
		}
		if got := probePort(t, c, g.Port.String()); got != port {
			t.Errorf("%s probe on port %d, the agent listens on %d", p.what, got, port)
		}
		// The kubelet probes the pod's IP (the node's, with hostNetwork) unless told otherwise:
		// an agent bound to loopback is reached only through host 127.0.0.1.
		if loopback && g.Host != "127.0.0.1" {
			t.Errorf("the agent listens on %s only, but the %s probe goes to the node address", host, p.what)
		}
	}
	// Issue 28: with hostNetwork, an agent on 0.0.0.0 is reachable from every pod of the node.
	if !loopback {
		t.Errorf("the shipped config listens on %s: every pod of the node could reach the agent; ship 127.0.0.1", host)
	}
	// Scrape annotations would send Prometheus to the node's address, where nothing listens.
	ann := ds.Spec.Template.Annotations
	if loopback && ann["prometheus.io/scrape"] == "true" {
		t.Errorf("scrape annotations %v, but the agent listens on %s only", ann, host)
	}
	var exposed bool
	for _, cp := range c.Ports {
		exposed = exposed || int(cp.ContainerPort) == port
	}
	if !exposed {
		t.Errorf("container ports %v do not name the agent's port %d", c.Ports, port)
	}
}

// probePort resolves a probe's port, by number or by the container port's name.
func probePort(t *testing.T, c corev1.Container, p string) int {
	if n, err := strconv.Atoi(p); err == nil {
		return n
	}
	for _, cp := range c.Ports {
		if cp.Name == p {
			return int(cp.ContainerPort)
		}
	}
	t.Errorf("probe port %q names no container port", p)
	return 0
}

func TestDaemonSetHostAccess(t *testing.T) {
	ds := daemonSet(t)
	pod := ds.Spec.Template.Spec
	c := agentContainer(t, ds)
	if !pod.HostNetwork {
		t.Error("hostNetwork is off: the agent manages the node's own devices")
	}
	if pod.HostPID {
		t.Error("hostPID is on: discovery reaches pod namespaces through /var/run/netns, not /proc/<pid>")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for path, prop := range hostMounts {
		m, ok := mounts[path]
		if !ok {
			t.Errorf("no mount at %s", path)
			continue
		}
		v := volume(t, ds, m.Name)
		if v == nil || v.HostPath == nil || v.HostPath.Path != path {
			t.Errorf("%s is not the host's %s (volume %+v)", path, path, v)
		}
		if prop != "" && (m.MountPropagation == nil || *m.MountPropagation != prop) {
			t.Errorf("%s propagation %v, want %s", path, m.MountPropagation, prop)
		}
		if slices.Contains(writable, path) && m.ReadOnly {
			t.Errorf("%s is read-only, and the agent writes there", path)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("the agent container names no capabilities")
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	if privileged {
		t.Error("privileged: the capabilities it needs are named; privileged would grant every other one")
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	sort.Strings(add)
	if !slices.Equal(add, capabilities) {
		t.Errorf("capabilities added %v, the agent needs %v", add, capabilities)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("capabilities dropped %v: drop ALL, then add what is needed", sc.Capabilities.Drop)
	}
	// What the API server would refuse.
	for _, m := range c.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional && !privileged {
			t.Errorf("%s: Bidirectional propagation is allowed only in privileged containers", m.MountPath)
		}
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation && slices.Contains(add, "SYS_ADMIN") {
		t.Error("allowPrivilegeEscalation false with SYS_ADMIN added is refused by the API")
	}
}

func TestDaemonSetScheduling(t *testing.T) {
	ds := daemonSet(t)
	pod := ds.Spec.Template.Spec
	every := false
	for _, tol := range pod.Tolerations {
		every = every || (tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == "")
	}
	if !every {
		t.Errorf("tolerations %v: want one {operator: Exists} so that every node, tainted or not, runs the agent", pod.Tolerations)
	}
	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil {
		t.Fatalf("update strategy %+v, want RollingUpdate", u)
	}
	if mu := u.RollingUpdate.MaxUnavailable; mu == nil || mu.String() != "1" {
		t.Errorf("maxUnavailable %v, want 1 (one node at a time)", mu)
	}
	if ms := u.RollingUpdate.MaxSurge; ms == nil || ms.String() != "0" {
		t.Errorf("maxSurge %v, want 0: two agents on one node would manage the same pins", ms)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= 0 {
		t.Errorf("terminationGracePeriodSeconds %v: set one, so SIGTERM comes before SIGKILL", g)
	}
}
