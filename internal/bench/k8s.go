package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/lab/k8s"
	"github.com/peregrine-net/peregrine/internal/results"
)

// The k8s style: configs measured on the real Kubernetes lab that is up (internal/lab/k8s),
// sharing it; see testbed.StyleK8s.

// usesK8s says whether any config runs on the Kubernetes lab.
func (o *Options) usesK8s() bool {
	for _, c := range o.Configs {
		if testbed.IsK8s(c.Style) {
			return true
		}
	}
	return false
}

// k8sArrangement checks a run on the cluster before anything is measured and takes the
// receive arrangement the cluster came up with: its nodes' underlay receive (NAPI thread and
// RPS) is on the CPU `lab up --style k8s --rx-cpu` chose, which a run can record, not change.
func (o *Options) k8sArrangement() error {
	if !o.usesK8s() {
		return nil
	}
	if err := checkK8sScenario(&o.Scenario); err != nil {
		return err
	}
	// Every refusal before the run starts: no result file for a run that cannot be.
	c, err := testbed.CheckK8s(context.Background(), o.k8sOptions())
	if err != nil {
		return err
	}
	if o.RxCPUs == nil {
		o.RxCPUs = []int{c.Spec.RxCPU}
	}
	if o.Scenario.ViaService {
		o.Scenario.ProxyMode = c.Spec.ProxyMode // kube-proxy's own, as the cluster runs it
	}
	// What the cluster's nodes do (internal/lab/k8s buildNodes); labs the run builds for other
	// configs (bench run --configs native,k8s/vanilla) get the same arrangement.
	o.NAPIThread = true
	return nil
}

func (o *Options) usesOnlyK8s() bool {
	for _, c := range o.Configs {
		if !testbed.IsK8s(c.Style) {
			return false
		}
	}
	return true
}

// checkK8sScenario refuses what the cluster cannot measure.
func checkK8sScenario(s *Scenario) error {
	switch s.Name {
	case "udp-inject":
		return errors.New("udp-inject is not available on the k8s style: it crafts VXLAN frames from a lab peregrine built (its MACs, VNI); use tcp, udp, pingpong, crr, nginx or memcached")
	}
	return nil
}

// k8sOptions are what the run asks of the cluster.
func (o *Options) k8sOptions() testbed.K8sOptions {
	return testbed.K8sOptions{Background: o.Scenario.Background != "" && o.Scenario.Background != "none",
		SameNode: o.Scenario.SameNode, ViaService: o.Scenario.ViaService, RxCPUs: o.RxCPUs, ModeCPUs: o.ModeCPUs, ToR: o.ToR}
}

// k8sRecord says in the run what the cluster was.
func (o *Options) k8sRecord(run *results.Run) {
	if !o.usesK8s() {
		return
	}
	c, err := k8s.Load()
	if err != nil {
		return
	}
	run.Lab.Name = fmt.Sprintf("k8s: Kubernetes %s, %d nodes, flannel VXLAN, kube-proxy %s", k8s.KubernetesVersion, len(c.Nodes), c.Spec.ProxyMode)
	run.Lab.Containers = 2 // the web Deployment's pods per node
	run.Notes = append(run.Notes, "k8s style: every config shares the one cluster; a config's modes are attached on both nodes (in the nodes' network namespaces, as `peregrine attach --netns`) just before its repetition and detached before another config's, so repetitions stay interleaved; the measured pods are kubelet's (Deployment web), the tools run in their network namespaces")
}
