package testbed

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/lab/k8s"
)

// The measured pair on the cluster: node 1's first web pod to node 2's first, whatever order
// the apiserver lists them in; the background pair the nodes' second pods; same-node the
// sender's node's second pod; too few pods an error that says where.
func TestPickK8sPods(t *testing.T) {
	n1, n2 := k8s.NodeName(1), k8s.NodeName(2)
	pods := []k8s.Pod{
		{Name: "web-b", Node: n2, IP: "10.244.1.3"},
		{Name: "web-z", Node: n1, IP: "10.244.0.3"},
		{Name: "web-a", Node: n2, IP: "10.244.1.2"},
		{Name: "web-c", Node: n1, IP: "10.244.0.2"},
	}
	nodes := []string{n1, n2}
	names := func(p k8sPick) string {
		var out []string
		for _, x := range p.all() {
			out = append(out, x.Name)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name string
		o    K8sOptions
		pods []k8s.Pod
		want string // sender,receiver[,bgSender,bgReceiver], or "error: ..." (a substring)
	}{
		{"across", K8sOptions{}, pods, "web-c,web-a"},
		{"background", K8sOptions{Background: true}, pods, "web-c,web-a,web-z,web-b"},
		{"same node", K8sOptions{SameNode: true}, pods, "web-c,web-z"},
		{"same node and background", K8sOptions{SameNode: true, Background: true}, pods, "error: no background pair"},
		{"one pod on node 2, background", K8sOptions{Background: true}, pods[1:], "error: want 2 running web pods on " + n2},
		{"none on node 2", K8sOptions{}, []k8s.Pod{pods[1]}, "error: want 1 running web pods on " + n2},
	} {
		pk, err := pickK8sPods(tc.pods, nodes, tc.o)
		if want, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: err %v, want one containing %q", tc.name, err, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := names(pk); got != tc.want {
			t.Errorf("%s: picked %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, err := pickK8sPods(pods, []string{n1}, K8sOptions{}); err == nil {
		t.Error("one node, across nodes: no error")
	}
}

// The pods' names under /run/netns are under the cluster's prefix, so the lab's own teardown
// sweeps what a killed bench left.
func TestK8sNetnsNamesAreTheClusters(t *testing.T) {
	if !strings.HasPrefix(k8sNetnsPrefix, k8s.Prefix) || !strings.HasPrefix(k8sNetnsPrefix, "prg-") {
		t.Errorf("prefix %q is not under the cluster's %q", k8sNetnsPrefix, k8s.Prefix)
	}
}
