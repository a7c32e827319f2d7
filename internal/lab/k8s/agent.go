package k8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ImportAgentImage builds the agent's image (what deploy/Containerfile builds: the static
// binary, deploy/config.yaml as its default config) under ref and imports it into every node.
func (c *Cluster) ImportAgentImage(ctx context.Context, ref, binary string) error {
	im, err := peregrineImage(ref, binary, filepath.Join(c.Spec.Repo, "deploy", "config.yaml"))
	if err != nil {
		return err
	}
	f := filepath.Join(c.Dir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return err
	}
	if err := writeArchiveFile(im, f); err != nil {
		return err
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		if err := c.importImages(ctx, i, f); err != nil {
			return err
		}
	}
	return nil
}

// InstallAgent installs peregrine as users do: its image on every node, then
// `kubectl apply -k deploy/kubernetes-lab` (the base manifests, with the lab's image and pull
// policy), and waits for an agent Ready on every node.
func (c *Cluster) InstallAgent(ctx context.Context, ref string) error {
	if err := c.ImportAgentImage(ctx, ref, c.Spec.AgentBinary); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-k", filepath.Join(c.Spec.Repo, "deploy", "kubernetes-lab")); err != nil {
		return err
	}
	return c.WaitAgent(ctx)
}

// WaitAgent waits for the DaemonSet's rollout: an up-to-date agent Ready on every node.
func (c *Cluster) WaitAgent(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "daemonset/peregrine-agent", "--timeout=120s"); err != nil {
		logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=peregrine", "--tail=20", "--prefix")
		desc, _ := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=peregrine", "-o", "wide")
		return fmt.Errorf("%w\n%s\n%s", err, desc, logs)
	}
	return nil
}

// RemoveAgent deletes the DaemonSet and runs the documented cleanup (`peregrine uninstall`)
// on every node with binary, so that no program, pin or knob is left.
func (c *Cluster) RemoveAgent(ctx context.Context, binary string) error {
	if _, err := c.Kubectl(ctx, "delete", "-k", filepath.Join(c.Spec.Repo, "deploy", "kubernetes-lab"), "--ignore-not-found", "--wait=true", "--timeout=60s"); err != nil {
		return err
	}
	// --wait covers the objects; the pods go on terminating a moment longer.
	if err := waitFor(ctx, 60*time.Second, 200*time.Millisecond, "the agents' pods gone", func() (bool, error) {
		out, err := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=peregrine", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", err
	}); err != nil {
		return err
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		if out, err := nodeCommand(ctx, i, binary, "uninstall").CombinedOutput(); err != nil {
			return fmt.Errorf("peregrine uninstall on %s: %w: %s", NodeName(i), err, out)
		}
	}
	return nil
}
