package datapath

import "testing"

func TestRecordKeepsFrameworkTyped(t *testing.T) {
	o := Options{CPUs: []int{3, 0}, Underlay: "eth0", KeepUnderlay: true, Extra: map[string]string{"x": "y"}}
	f := frameworkOf(o)
	o.CPUs[0] = 9 // the record holds its own copy
	if f.Underlay != "eth0" || !f.KeepUnderlay || len(f.CPUs) != 2 || f.CPUs[0] != 3 {
		t.Fatalf("framework record %+v", f)
	}
}
