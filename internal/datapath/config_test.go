package datapath

import "testing"

func TestOptionsRecordCPUList(t *testing.T) {
	m := optionsMap(Options{CPUs: []int{3, 0, 1, 2}, Underlay: "eth0", Extra: map[string]string{"x": "y"}})
	if m[OptCPUs] != "0-3" || m[OptUnderlay] != "eth0" || m["x"] != "y" {
		t.Fatalf("saved options %v", m)
	}
}
