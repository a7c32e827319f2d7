package k8s

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// Daemon is one process the cluster runs.
type Daemon struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
	Log     string `json:"log"`
}

// Daemons lists the cluster's processes, from their pid files.
func (c *Cluster) Daemons() []Daemon {
	fs, _ := filepath.Glob(filepath.Join(c.Dir, "run", "*.pid"))
	sort.Strings(fs)
	var out []Daemon
	for _, f := range fs {
		tag := strings.TrimSuffix(filepath.Base(f), ".pid")
		out = append(out, Daemon{Name: tag, Running: c.alive(tag), Log: c.logPath(tag)})
	}
	return out
}

// NodeIndex reads a node's name: "n2", "2" or "prg-k8s-n2".
func (c *Cluster) NodeIndex(name string) (int, error) {
	s := strings.TrimPrefix(strings.TrimPrefix(name, Prefix), "n")
	for _, n := range c.Nodes {
		if fmt.Sprint(n.Index) == s {
			return n.Index, nil
		}
	}
	var names []string
	for _, n := range c.Nodes {
		names = append(names, fmt.Sprintf("n%d", n.Index))
	}
	return 0, fmt.Errorf("no node %q in the k8s lab (nodes: %s)", name, strings.Join(names, ", "))
}

// Healthy says what is wrong with a cluster that is up: a daemon that died, a node not Ready.
func (c *Cluster) Healthy(ctx context.Context) error {
	var dead []string
	for _, d := range c.Daemons() {
		if !d.Running {
			dead = append(dead, d.Name+" ("+d.Log+")")
		}
	}
	if len(dead) > 0 {
		return fmt.Errorf("not running: %s", strings.Join(dead, ", "))
	}
	return nil
}
