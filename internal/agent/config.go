// Package agent is the node agent, `peregrine agent --config FILE`: one supervised process per
// node that attaches the configured modes, hosts their agents in goroutines (agentproc.Host),
// keeps what it attached in place (reconcile.go), applies config changes as a difference,
// serves /healthz, /readyz and /metrics (health.go) and writes a status file for `peregrine
// status` (status.go). Stopping it leaves the datapath in place for the next start to adopt.
package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode a config may name
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// Defaults of the config file's keys.
const (
	DefaultListen    = "127.0.0.1:9465"
	DefaultInterval  = 5 * time.Second
	minInterval      = 100 * time.Millisecond
	maxConfigBytes   = 1 << 20
	topKeysForErrors = "modes, netns, cpus, underlay, listen, listen_remote, reconcile_interval"
)

// Config is the agent's config file, checked: every mode's options parsed by the mode's own
// declaration (datapath.Configure), so an accepted config attaches without an option error.
type Config struct {
	Modes    map[string]ModeConfig
	Netns    string
	CPUs     []int
	Underlay string
	Listen   string
	// ListenRemote acknowledges a listen address other than loopback (listen_remote: true).
	ListenRemote bool
	Interval     time.Duration
	Hash         string // of the file's bytes: a changed file is re-read only when this differs
}

// ModeConfig is one configured mode.
type ModeConfig struct {
	Extra map[string]string // the options as attach takes them
	// Typed is the mode's config as Configure returns it, JSON-encoded as the record keeps it
	// (State.Config): an attachment whose record holds the same is the configured one.
	Typed []byte
}

// Options are the attach options of mode m.
func (c *Config) Options(m string) datapath.Options {
	return datapath.Options{Underlay: c.Underlay, CPUs: slices.Clone(c.CPUs), Extra: c.Modes[m].Extra}
}

// ModeNames lists the configured modes, sorted.
func (c *Config) ModeNames() []string {
	var ns []string
	for n := range c.Modes {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// ReadConfig reads and checks the config file: a regular file (a FIFO would block the loop)
// of at most maxConfigBytes.
func ReadConfig(path string) (*Config, error) {
	b, err := safefile.ReadRegular(path, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes and checks a config file's text. Errors name the key's path
// (modes.prism.rules[1]) and the reason; nothing is applied by parsing.
func ParseConfig(text []byte) (*Config, error) {
	var top map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(text))
	if err := dec.Decode(&top); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("empty: it needs at least `modes:`")
		}
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var extra any
	if dec.Decode(&extra) == nil {
		return nil, fmt.Errorf("more than one YAML document: give one")
	}
	sum := sha256.Sum256(text)
	c := &Config{Modes: map[string]ModeConfig{}, Listen: DefaultListen, Interval: DefaultInterval,
		Hash: fmt.Sprintf("%x", sum[:8])}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var cpus string
	for _, k := range keys {
		v := top[k]
		var err error
		switch k {
		case "modes":
			continue // after the framework's keys, which the modes' configs depend on
		case "netns":
			c.Netns, err = str(v)
		case "cpus":
			cpus, err = str(v)
		case "underlay":
			c.Underlay, err = str(v)
		case "listen":
			c.Listen, err = str(v) // checked below, with listen_remote
		case "listen_remote":
			b, ok := v.(bool)
			if !ok {
				err = fmt.Errorf("want true or false, not %s", kind(v))
			}
			c.ListenRemote = b
		case "reconcile_interval":
			var s string
			if s, err = str(v); err == nil {
				if c.Interval, err = time.ParseDuration(s); err == nil && c.Interval < minInterval {
					err = fmt.Errorf("%s is too short (at least %s)", s, minInterval)
				}
			}
		default:
			err = fmt.Errorf("unknown key (the keys are: %s)", topKeysForErrors)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	if cpus != "" {
		list, err := cpuset.Parse(cpus)
		if err == nil {
			err = cpuset.CheckOnline(list)
		}
		if err != nil {
			return nil, fmt.Errorf("cpus: %q: %w", cpus, err)
		}
		c.CPUs = list
	}
	if err := checkListen(c.Listen, c.ListenRemote); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if strings.ContainsAny(c.Netns, "\x00\n") {
		return nil, fmt.Errorf("netns: %q is not a namespace name", c.Netns)
	}
	modes, ok := top["modes"]
	if !ok || modes == nil {
		return nil, fmt.Errorf("modes: missing: name at least one mode (%s)", strings.Join(datapath.ModeNames(), ", "))
	}
	mm, ok := modes.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("modes: want a map of mode name to its options, not %s", kind(modes))
	}
	if len(mm) == 0 {
		return nil, fmt.Errorf("modes: empty: name at least one mode (%s)", strings.Join(datapath.ModeNames(), ", "))
	}
	for _, name := range sortedKeys(mm) {
		mc, err := c.modeConfig(name, mm[name])
		if err != nil {
			return nil, err
		}
		c.Modes[name] = mc
	}
	return c, nil
}

// modeConfig checks one mode's options the way attach would, key by key so that the error
// names the key.
func (c *Config) modeConfig(name string, v any) (ModeConfig, error) {
	path := "modes." + name
	if _, err := datapath.Lookup(name); err != nil {
		return ModeConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	var opts map[string]any
	switch x := v.(type) {
	case nil:
	case map[string]any:
		opts = x
	default:
		return ModeConfig{}, fmt.Errorf("%s: want a map of the mode's options (`peregrine options %s`), or {}, not %s", path, name, kind(v))
	}
	extra := map[string]string{}
	for _, k := range sortedKeys(opts) {
		one, err := option.FromAny(map[string]any{k: opts[k]})
		if err == nil {
			err = datapath.CheckOptions(name, one)
		}
		if err != nil {
			return ModeConfig{}, fmt.Errorf("%s.%s: %w", path, k, err)
		}
		for kk, vv := range one {
			extra[kk] = vv
		}
	}
	o := datapath.Options{Underlay: c.Underlay, CPUs: c.CPUs, Extra: extra}
	typed, err := datapath.Configure(name, o)
	if err != nil {
		return ModeConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	mc := ModeConfig{Extra: extra}
	if typed != nil {
		mc.Typed, _ = json.Marshal(typed)
	}
	return mc, nil
}

// checkListen refuses an address other than loopback unless listen_remote acknowledges it. The
// agent runs in the host's network namespace (hostNetwork): on 0.0.0.0 every pod on the node,
// and anything that reaches the node, can make it work and read what it reports (the
// attachments, the knobs, per-CPU counters).
func checkListen(listen string, remote bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("want host:port, e.g. %s: %v", DefaultListen, err)
	}
	if remote || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	what := fmt.Sprintf("%q is not a loopback address", host)
	if host == "" || host == "0.0.0.0" || host == "::" {
		what = fmt.Sprintf("%q listens on every address of the node", listen)
	}
	return fmt.Errorf("%s: with the host's network (systemd, or hostNetwork in Kubernetes) every pod on the node "+
		"could then reach the agent (its metrics tell what is attached and how it is tuned, and each request costs the node CPU); "+
		"use %s (the kubelet's probes use 127.0.0.1 too), or, to let a remote Prometheus scrape it, "+
		"give the node's address, add `listen_remote: true` and allow only the scraper (firewall or NetworkPolicy)", what, DefaultListen)
}

func str(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	}
	return "", fmt.Errorf("want a string, not %s", kind(v))
}

func kind(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "a map"
	case []any:
		return "a list"
	case nil:
		return "nothing"
	default:
		return fmt.Sprintf("%T %v", x, x)
	}
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
