package k8s

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

// TestSetupScriptAgrees: setup-k8s.sh builds exactly the versions and paths this package runs,
// and setup.sh runs it.
func TestSetupScriptAgrees(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/setup-k8s.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"k8s_v=" + KubernetesVersion, "kuberouter_v=" + KubeRouterVersion, "pause_dir=$cache/pause-" + PauseVersion,
		"cache=" + CacheDir, "k8s_dir=$cache/k8s-$k8s_v", "kuberouter_dir=$cache/kube-router-$kuberouter_v",
		"etcd-server", "containerd", "runc", "busybox-static", "ipset", "containernetworking-plugins"} {
		if !strings.Contains(s, want) {
			t.Errorf("scripts/setup-k8s.sh does not say %q", want)
		}
	}
	for _, p := range kubePrograms {
		if !strings.Contains(s, p) {
			t.Errorf("scripts/setup-k8s.sh does not build %s", p)
		}
	}
	d := DefaultBinaries()
	if d.Kube != CacheDir+"/k8s-"+KubernetesVersion || d.KubeRouter != CacheDir+"/kube-router-"+KubeRouterVersion+"/kube-router" ||
		d.Pause != CacheDir+"/pause-"+PauseVersion+"/pause" {
		t.Errorf("paths differ from setup-k8s.sh's: %+v", d)
	}
	setup, err := os.ReadFile("../../../scripts/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(setup), "scripts/setup-k8s.sh") {
		t.Error("scripts/setup.sh does not run scripts/setup-k8s.sh")
	}
}

func TestSpecValidate(t *testing.T) {
	for _, s := range []Spec{{Nodes: 2}, {Nodes: 1, ProxyMode: "nftables"}, {Nodes: 8, ProxyMode: "iptables"}} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	s := Spec{Nodes: 2}
	_ = s.Validate()
	if s.ProxyMode != ProxyIPTables {
		t.Errorf("default proxy mode %q", s.ProxyMode)
	}
	for _, s := range []Spec{{Nodes: 0}, {Nodes: 9}, {Nodes: 2, ProxyMode: "ipvs"}, {Nodes: 2, RxCPU: -1},
		{Nodes: 2, Agent: true}, {Nodes: 2, Agent: true, AgentBinary: "/nonexistent"},
		{Nodes: 2, Agent: true, AgentBinary: "/bin/sh"}} { // dynamically linked
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

func TestNodeIndex(t *testing.T) {
	c := &Cluster{Nodes: []Node{{Index: 1}, {Index: 2}}}
	for in, want := range map[string]int{"n1": 1, "2": 2, "prg-k8s-n2": 2} {
		if got, err := c.NodeIndex(in); err != nil || got != want {
			t.Errorf("%s: %d %v", in, got, err)
		}
	}
	for _, bad := range []string{"n3", "", "h1", "n0", "prg-k8s-n"} {
		if _, err := c.NodeIndex(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestImageArchive: the docker-archive holds a manifest naming the config and the layer, the
// layer's digest is the config's diff_id, and the layer holds the files with their modes.
func TestImageArchive(t *testing.T) {
	im := image{ref: "localhost/x:1", files: []imageFile{
		{path: "bin", mode: 0o755, dir: true}, {path: "bin/x", mode: 0o755, data: []byte("hello")}, {path: "bin/y", mode: 0o777, link: "x"},
	}, entrypoint: []string{"/bin/x"}}
	var buf bytes.Buffer
	if err := im.writeArchive(&buf); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	var man []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &man); err != nil || len(man) != 1 {
		t.Fatalf("manifest %s: %v", files["manifest.json"], err)
	}
	if man[0].RepoTags[0] != "localhost/x:1" || len(man[0].Layers) != 1 {
		t.Fatalf("manifest %+v", man[0])
	}
	var cfg struct {
		Config struct{ Entrypoint []string }
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(files[man[0].Config], &cfg); err != nil {
		t.Fatal(err)
	}
	layer := files[man[0].Layers[0]]
	if want := "sha256:" + strings.TrimSuffix(man[0].Layers[0], "/layer.tar"); cfg.Rootfs.DiffIDs[0] != want {
		t.Errorf("diff_id %s, layer %s", cfg.Rootfs.DiffIDs[0], want)
	}
	if cfg.Config.Entrypoint[0] != "/bin/x" {
		t.Errorf("entrypoint %v", cfg.Config.Entrypoint)
	}
	lr := tar.NewReader(bytes.NewReader(layer))
	seen := map[string]bool{}
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = true
		if h.Name == "bin/y" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "x") {
			t.Errorf("bin/y: %+v", h)
		}
		if h.Name == "bin/x" && h.Mode != 0o755 {
			t.Errorf("bin/x mode %o", h.Mode)
		}
	}
	if !seen["bin/"] || !seen["bin/x"] || !seen["bin/y"] {
		t.Errorf("layer holds %v", seen)
	}
}

func TestParseFastPathHits(t *testing.T) {
	st := `fastpath on this node: attached since 2026-11-28 08:57:42
  fastpath egress : hits 2800 (693 to pods on this node), misses 1063, learned 69, fallbacks 304 (stale 1)
  fastpath ingress: hits 2307, misses 61, learned 21, fallbacks 40 (stale 1, proto 39)
  overlay 0: routed layout
    egress hits 2800, misses 1063, fallbacks 304; ingress hits 2307, misses 61, fallbacks 40
`
	if h, err := parseFastPathHits(st); err != nil || h != 5107 {
		t.Fatalf("parseFastPathHits = %v, %v; want 5107 (egress + ingress totals, not the overlay line)", h, err)
	}
	for _, bad := range []string{"", "nothing attached (modes: fastpath)\n", "  fastpath egress : hits 5, misses 0\n", "  fastpath egress : hits x\n  fastpath ingress: hits 1\n"} {
		if h, err := parseFastPathHits(bad); err == nil {
			t.Errorf("parseFastPathHits(%q) = %v, want an error", bad, h)
		}
	}
}
