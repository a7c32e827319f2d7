package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
)

// A config that is refused names the key's path and the reason; nothing is returned to apply.
func TestConfigRefusedWithKeyAndReason(t *testing.T) {
	online, err := cpuset.Online()
	if err != nil {
		t.Fatal(err)
	}
	beyond := online[len(online)-1] + 1
	for _, tc := range []struct {
		name, text string
		want       []string // every one must be in the error
	}{
		{"unknown top-level key", "modes:\n  fastpath: {}\nlisten_addr: 1.2.3.4:1\n", []string{"listen_addr:", "unknown key"}},
		{"unknown mode", "modes:\n  fastpth: {}\n", []string{"modes.fastpth:", "unknown mode"}},
		{"unknown mode option", "modes:\n  prism:\n    rulez: [\"proto=tcp\"]\n", []string{"modes.prism.rulez:", "does not take"}},
		{"framework key as a mode option", "modes:\n  prism:\n    cpus: \"0\"\n", []string{"modes.prism.cpus:", "not a mode option"}},
		{"wrong type: bool", "modes:\n  fastpath:\n    agent: maybe\n", []string{"modes.fastpath.agent:", "maybe"}},
		{"wrong type: map for a string", "modes:\n  fastpath: {}\nlisten: {a: 1}\n", []string{"listen:", "want a string"}},
		{"wrong type: options not a map", "modes:\n  fastpath: [1]\n", []string{"modes.fastpath:", "want a map"}},
		{"nested option value", "modes:\n  prism:\n    rules: [{a: 1}]\n", []string{"modes.prism.rules:", "rules[0]"}},
		{"bad rule", "modes:\n  prism:\n    rules: [\"proto=tcp dport=99999\"]\n", []string{"modes.prism:", "99999"}},
		{"bad CPU list", "modes:\n  fastpath: {}\ncpus: 0-x\n", []string{"cpus:", "0-x"}},
		{"CPU not online", "modes:\n  fastpath: {}\ncpus: \"" + strconv.Itoa(beyond) + "\"\n", []string{"cpus:", strconv.Itoa(beyond)}},
		{"bad hp_cpus list", "modes:\n  prism:\n    rules: [\"proto=tcp\"]\n    hp_cpus: \"3-1\"\n", []string{"modes.prism", "hp-cpus", "3-1"}},
		{"bad interval", "modes:\n  fastpath: {}\nreconcile_interval: soon\n", []string{"reconcile_interval:", "soon"}},
		{"interval too short", "modes:\n  fastpath: {}\nreconcile_interval: 1ms\n", []string{"reconcile_interval:", "too short"}},
		{"bad listen", "modes:\n  fastpath: {}\nlisten: nowhere\n", []string{"listen:", "host:port"}},
		{"no modes", "listen: 127.0.0.1:1\n", []string{"modes:", "missing"}},
		{"empty modes", "modes: {}\n", []string{"modes:", "empty"}},
		{"duplicate key", "modes:\n  fastpath: {}\nmodes:\n  rps: {}\n", []string{"not valid YAML", "already"}},
		{"empty file", "", []string{"empty"}},
		{"two documents", "modes:\n  fastpath: {}\n---\nmodes:\n  rps: {}\n", []string{"more than one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.text))
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if c != nil {
				t.Errorf("a refused config came back with a value to apply: %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The deploy config and a full one parse into what attach takes; the typed config is what a
// record of the same attach holds (the adoption test compares them).
func TestConfigAccepted(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		t.Fatalf("deploy/config.yaml: %v", err)
	}
	if _, ok := c.Modes["fastpath"]; !ok || c.Interval != 5*time.Second || c.Listen != "127.0.0.1:9465" {
		t.Errorf("deploy/config.yaml read as %+v", c)
	}
	c, err = ParseConfig([]byte("modes:\n  fastpath:\n    one_way: true\n  prism:\n    rules: [\"proto=tcp dport=6379\", \"proto=udp\"]\n    agent: false\ncpus: \"0\"\nnetns: prg-x-h1\nreconcile_interval: 250ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Netns != "prg-x-h1" || len(c.CPUs) != 1 || c.Interval != 250*time.Millisecond || c.Listen != DefaultListen {
		t.Errorf("read as %+v", c)
	}
	if got := c.Modes["prism"].Extra["rules"]; got != "proto=tcp dport=6379;proto=udp" {
		t.Errorf("prism rules %q", got)
	}
	if !strings.Contains(string(c.Modes["prism"].Typed), `"dport"`) && !strings.Contains(string(c.Modes["prism"].Typed), "6379") {
		t.Errorf("prism's typed config lacks its rules: %s", c.Modes["prism"].Typed)
	}
	if c.Modes["fastpath"].Extra["one_way"] != "true" {
		t.Errorf("fastpath options %v", c.Modes["fastpath"].Extra)
	}
}
