package deploy

import (
	"bytes"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	yaml3 "gopkg.in/yaml.v3"

	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode registers itself
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// configKeys are the config file's top-level keys (the agent's contract).
var configKeys = []string{"cpus", "listen", "listen_remote", "modes", "netns", "reconcile_interval", "underlay"}

func decodeConfig(t *testing.T, b []byte) map[string]any {
	t.Helper()
	cfg, err := parseConfig(b)
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return cfg
}

// parseConfig decodes the agent's config as plain YAML and checks it the way the modes check
// their options: every mode registered, every option declared and well typed, and the
// framework's keys well formed. It is this test's own reading of the contract (the agent has
// its own parser); the point is that the shipped config is one a mode would accept.
func parseConfig(b []byte) (map[string]any, error) {
	var cfg map[string]any
	if err := yaml3.Unmarshal(b, &cfg); err != nil {
		return nil, err
	}
	var unknown []string
	for k := range cfg {
		if !contains(configKeys, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("unknown key(s) %v (the config takes %v)", unknown, configKeys)
	}
	modes, ok := cfg["modes"].(map[string]any)
	if !ok || len(modes) == 0 {
		return nil, fmt.Errorf("modes: want a map of mode name to options, got %T", cfg["modes"])
	}
	for name, opts := range modes {
		if _, err := datapath.Lookup(name); err != nil {
			return nil, fmt.Errorf("modes.%s: %w", name, err)
		}
		m := map[string]any{}
		switch o := opts.(type) {
		case nil:
		case map[string]any:
			m = o
		default:
			return nil, fmt.Errorf("modes.%s: want a map of options, got %T", name, opts)
		}
		values, err := option.FromAny(m)
		if err != nil {
			return nil, fmt.Errorf("modes.%s.%w", name, err)
		}
		if err := datapath.CheckOptions(name, values); err != nil {
			return nil, fmt.Errorf("modes.%s: %w", name, err)
		}
	}
	for _, k := range []string{"netns", "cpus", "underlay", "listen", "reconcile_interval"} {
		if v, present := cfg[k]; present {
			if _, ok := v.(string); !ok {
				return nil, fmt.Errorf("%s: want a string, got %T", k, v)
			}
		}
	}
	if s, _ := cfg["cpus"].(string); s != "" {
		if _, err := cpuset.Parse(s); err != nil {
			return nil, fmt.Errorf("cpus: %w", err)
		}
	}
	if s, _ := cfg["listen"].(string); s != "" {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	if s, _ := cfg["reconcile_interval"].(string); s != "" {
		if d, err := time.ParseDuration(s); err != nil || d <= 0 {
			return nil, fmt.Errorf("reconcile_interval: want a positive duration such as 5s, got %q", s)
		}
	}
	return cfg, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// TestShippedConfig: the ConfigMap's config is the image's default config, and the modes
// accept it.
func TestShippedConfig(t *testing.T) {
	image := read(t, "config.yaml")
	cm := []byte(configMapObj(t).Data[configKey])
	if !bytes.Equal(bytes.TrimSpace(image), bytes.TrimSpace(cm)) {
		t.Error("kubernetes/configmap.yaml's config.yaml differs from config.yaml (the image's default): keep them one text")
	}
	cfg := decodeConfig(t, cm)
	if _, ok := cfg["listen"]; !ok {
		t.Error("the config names no listen address: the probes need one they can reach")
	}
	// The agent's own parser takes it as it is (it refuses a listen beyond loopback unless
	// acknowledged, and a config it refuses is fatal at start).
	if _, err := agent.ParseConfig(cm); err != nil {
		t.Errorf("the agent refuses the shipped config: %v", err)
	}
}

// TestConfigCheckRefuses proves parseConfig can fail, each way it claims to check.
func TestConfigCheckRefuses(t *testing.T) {
	for _, c := range []struct{ cfg, want string }{
		{"modes:\n  fastpth: {}\n", "modes.fastpth: unknown mode"},
		{"modes:\n  fastpath:\n    agnet: true\n", "does not take option(s) agnet"},
		{"modes:\n  fastpath:\n    agent: maybe\n", "want true or false"},
		{"modes:\n  prism:\n    rules: {a: b}\n", "modes.prism.rules"},
		{"modes:\n  fastpath: {}\nlisten: 9465\n", "listen: want a string"},
		{"modes:\n  fastpath: {}\ncpus: \"0-x\"\n", "cpus:"},
		{"modes:\n  fastpath: {}\nreconcile_interval: 5\n", "reconcile_interval: want a string"},
		{"modes:\n  fastpath: {}\nmetrics: 127.0.0.1:9465\n", "unknown key(s) [metrics]"},
		{"modes: {}\n", "modes: want a map"},
	} {
		_, err := parseConfig([]byte(c.cfg))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %q: error %v, want one containing %q", c.cfg, err, c.want)
		}
	}
	if _, err := parseConfig([]byte("modes:\n  prism:\n    rules: [\"proto=tcp dport=6379\"]\n  fastpath: {}\n")); err != nil {
		t.Errorf("the contract's own example is refused: %v", err)
	}
}
