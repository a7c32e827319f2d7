package bench

import (
	"strings"
	"testing"
)

// On the k8s style every config is on the cluster: no native baseline (vanilla is the first),
// native asked for by name is refused, and udp-inject (frames from a lab peregrine built) too.
func TestK8sConfigs(t *testing.T) {
	cfgs, err := ModeConfigs(StyleK8s, strings.Split(K8sCompareModes, ","))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cfgs {
		names = append(names, c.Name())
		if c.Style != StyleK8s {
			t.Errorf("config %s has style %s", c.Name(), c.Style)
		}
	}
	if got := strings.Join(names, ","); got != "k8s/vanilla,k8s/fastpath,k8s/prism" {
		t.Errorf("configs %s", got)
	}
	if _, err := ModeConfigs(StyleK8s, []string{"native", "vanilla"}); err == nil || !strings.Contains(err.Error(), "no native baseline") {
		t.Errorf("native on k8s: %v", err)
	}
	if c, err := ParseConfig("k8s/fastpath"); err != nil || c.Mode != "fastpath" {
		t.Errorf("k8s/fastpath: %+v, %v", c, err)
	}
	o := Options{Configs: cfgs}
	if !o.usesK8s() || !o.usesOnlyK8s() {
		t.Error("usesK8s/usesOnlyK8s false for k8s configs")
	}
	for _, sc := range []string{"tcp", "pingpong", "crr", "nginx", "memcached"} {
		if err := checkK8sScenario(&Scenario{Name: sc}); err != nil {
			t.Errorf("%s refused on k8s: %v", sc, err)
		}
	}
	if err := checkK8sScenario(&Scenario{Name: "udp-inject"}); err == nil {
		t.Error("udp-inject accepted on k8s")
	}
}
