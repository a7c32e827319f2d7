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

// Through a Service the server listens on the Service's target port, which is what prism's
// bench rule must name (it named the scenario's own port, so a --via-service run measured no
// high-priority frame at all).
func TestModeExtraViaService(t *testing.T) {
	for _, tc := range []struct {
		style string
		via   bool
		want  string
	}{
		{StyleK8s, false, "dport=11111;sport=11111"},
		{StyleK8s, true, "dport=47999;sport=47999"},
		{"flannel", true, "dport=47999;sport=47999"}, {"flannel", false, "dport=11111;sport=11111"},
	} {
		o := Options{Scenario: Scenario{Name: "pingpong", ViaService: tc.via}}
		if got := o.modeExtra("prism", tc.style)["rules"]; got != tc.want {
			t.Errorf("%s via-service=%v: prism rules %q, want %q", tc.style, tc.via, got, tc.want)
		}
	}
}
