package datapath

import (
	"strings"
	"testing"
)

func TestConfigureRefusesStrayOptions(t *testing.T) {
	for extra, want := range map[string]map[string]string{
		"does not take":     {"split_cpus": "1"},
		"not a mode option": {OptCPUs: "0-1"},
	} {
		if _, err := Configure(ModeRPS, Options{Extra: want}); err == nil || !strings.Contains(err.Error(), extra) {
			t.Errorf("rps with %v: %v, want an error saying %q", want, err, extra)
		}
	}
	if _, err := Configure(ModeRPS, Options{CPUs: []int{0}}); err != nil {
		t.Errorf("rps with --cpus only: %v", err)
	}
	if got := FilterOptions(ModeRPS, map[string]string{"split_cpus": "1"}); len(got) != 0 {
		t.Errorf("FilterOptions kept %v for rps", got)
	}
}

func TestRecordKeepsFrameworkTyped(t *testing.T) {
	o := Options{CPUs: []int{3, 0}, Underlay: "eth0", KeepUnderlay: true, Extra: map[string]string{"x": "y"}}
	f := frameworkOf(o)
	o.CPUs[0] = 9 // the record holds its own copy
	if f.Underlay != "eth0" || !f.KeepUnderlay || len(f.CPUs) != 2 || f.CPUs[0] != 3 {
		t.Fatalf("framework record %+v", f)
	}
}
