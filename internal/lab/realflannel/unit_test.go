package realflannel

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSetupScriptAgrees: setup.sh builds exactly the versions and paths this package runs.
func TestSetupScriptAgrees(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"flannel_v=" + FlannelVersion, "cniplugins_v=" + CNIPluginsVersion, "cnitool_v=" + CNIToolVersion,
		"cache=" + CacheDir, "$cache/flanneld-$flannel_v/flanneld", "$cache/cni-plugins-$cniplugins_v/flannel", "$cache/cnitool-$cnitool_v/cnitool",
		"etcd-server", "containernetworking-plugins"} {
		if !strings.Contains(s, want) {
			t.Errorf("scripts/setup.sh does not say %q", want)
		}
	}
	d := DefaultBinaries()
	if d.Flanneld != CacheDir+"/flanneld-"+FlannelVersion+"/flanneld" || d.CNITool != CacheDir+"/cnitool-"+CNIToolVersion+"/cnitool" ||
		d.FlannelCNI != CacheDir+"/cni-plugins-"+CNIPluginsVersion {
		t.Errorf("paths differ from setup.sh's: %+v", d)
	}
}

func TestSpecValidate(t *testing.T) {
	for _, s := range []Spec{{Name: "rf", Nodes: 2, Pods: 2}, {Name: "b12345x1", Nodes: 1}, {Name: "a1", Nodes: 16, Pods: 32}} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	for _, s := range []Spec{{Name: "", Nodes: 2}, {Name: "Rf", Nodes: 2}, {Name: "r-f", Nodes: 2}, {Name: "../x", Nodes: 2},
		{Name: "abcdefghijk", Nodes: 2}, {Name: "rf", Nodes: 0}, {Name: "rf", Nodes: 17}, {Name: "rf", Nodes: 2, Pods: -1}, {Name: "rf", Nodes: 2, Pods: 33}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	if err := Down("../etc"); err == nil {
		t.Error("Down accepted a name with a path in it")
	}
}

func TestParsePodNetns(t *testing.T) {
	for ns, want := range map[string]struct {
		node int
		pod  string
		ok   bool
	}{
		"prg-rf-n1-p1":  {1, "p1", true},
		"prg-rf-n12-p9": {12, "p9", true},
		"prg-rf-n1":     {0, "", false},
		"prg-rf-ul":     {0, "", false},
		"prg-rfx-n1-p1": {0, "", false}, // another lab
		"prg-rf-nx-p1":  {0, "", false},
		"prg-rf-n0-p1":  {0, "", false},
	} {
		node, pod, ok := parsePodNetns("rf", ns)
		if node != want.node || pod != want.pod || ok != want.ok {
			t.Errorf("%s: %d %q %v, want %+v", ns, node, pod, ok, want)
		}
	}
}

func TestResultAddr(t *testing.T) {
	out := []byte(`{"cniVersion":"0.3.1","interfaces":[{"name":"cni0"}],"ips":[{"version":"6","address":"fd00::2/64"},{"version":"4","interface":2,"address":"10.244.7.3/24","gateway":"10.244.7.1"}],"dns":{}}`)
	a, err := resultAddr(out)
	if err != nil || a != netip.MustParseAddr("10.244.7.3") {
		t.Fatalf("%v %v", a, err)
	}
	for _, bad := range []string{"", "error", `{"ips":[]}`, `{"ips":[{"address":"nonsense"}]}`, `{"ips":`} {
		if _, err := resultAddr([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestReadSubnetFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "subnet.env")
	os.WriteFile(p, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.31.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"), 0o600)
	got, err := readSubnetFile(p)
	if err != nil || got != netip.MustParsePrefix("10.244.31.0/24") {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"FLANNEL_MTU=1450\n", "FLANNEL_SUBNET=x\n"} {
		os.WriteFile(p, []byte(bad), 0o600)
		if _, err := readSubnetFile(p); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestNetconf: each node's CNI config reads its own subnet file and keeps host-local's and the
// flannel plugin's state in the lab's directory (so down removes them).
func TestNetconf(t *testing.T) {
	l := &Lab{Spec: Spec{Name: "rf", Nodes: 2}, Dir: Dir("rf")}
	b, err := l.netconf(2)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c["type"] != "flannel" || c["name"] != "prg-rf" || c["subnetFile"] != StateRoot+"/rf/n2/subnet.env" ||
		c["dataDir"] != StateRoot+"/rf/n2/flannel-cni" || c["ipam"].(map[string]any)["dataDir"] != StateRoot+"/rf/n2/host-local" {
		t.Fatalf("netconf: %s", b)
	}
}

func TestCPUMask(t *testing.T) {
	for n, want := range map[int]string{0: "1", 1: "2", 31: "80000000", 32: "1,00000000", 65: "2,00000000,00000000"} {
		if got := cpuMask(n); got != want {
			t.Errorf("cpuMask(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestEtcdPlacement: two nodes share a cable and etcd runs on node 1 (no third namespace, which
// down would otherwise have to find); three or more share the bridge namespace, where etcd has
// an address no node holds.
func TestEtcdPlacement(t *testing.T) {
	for _, c := range []struct {
		nodes      int
		direct     bool
		netns, url string
	}{
		{1, false, "prg-rf-ul", "http://10.250.0.254:2379"},
		{2, true, "prg-rf-n1", "http://10.250.0.1:2379"},
		{3, false, "prg-rf-ul", "http://10.250.0.254:2379"},
	} {
		l := &Lab{Spec: Spec{Name: "rf", Nodes: c.nodes}}
		if l.Spec.Direct() != c.direct || l.etcdNetns() != c.netns || l.etcdURL() != c.url {
			t.Errorf("%d nodes: direct %v, etcd in %s at %s; want %v, %s, %s", c.nodes, l.Spec.Direct(), l.etcdNetns(), l.etcdURL(), c.direct, c.netns, c.url)
		}
	}
}
