// Package bench runs peregrine's benchmarks: it builds one lab per configuration (style + datapath
// mode), runs a workload scenario over every point of a sweep, repetitions interleaved across
// configurations (A/B/A/B) so drift hits all alike, samples the probes around every repetition,
// and writes one results.Run. Performance goals are ratios measured side by side in one run.
package bench

import (
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode, for ParseConfig
	"github.com/peregrine-net/peregrine/internal/lab"
)

// StyleK8s is the real Kubernetes lab's style (testbed.StyleK8s).
const StyleK8s = testbed.StyleK8s

// K8sCompareModes is `bench compare --style k8s`'s --modes default: the kernel as kubelet,
// flannel and kube-proxy leave it, the fast path, and PRISM.
const K8sCompareModes = ModeVanilla + ",fastpath,prism"

// ModeVanilla is "nothing attached": the kernel as it comes.
const ModeVanilla = "vanilla"

// DefaultCompareModes is `bench compare`'s --modes default: the kernel as it comes against its
// usual tuning (RPS on every stage device). Mode names are the bench's data; the CLI names none.
const DefaultCompareModes = ModeVanilla + ",rps"

// Config is one column of a comparison: a lab style with zero or more datapath modes stacked
// on it, each with its options (attach flags, e.g. falcon's split_cpus or mflow's batch).
type Config struct {
	Style string
	Mode  string // the modes joined by "+" ("vanilla" for none): the results' mode field
	Stack []ModeSpec
	name  string // as written, for results
}

// ModeSpec is one mode of a config's stack.
type ModeSpec struct {
	Mode  string
	Extra map[string]string
}

// Name is the config's name in results: "docker/vanilla", "native", "docker/falcon@split_cpus=1",
// "docker/falcon/prism@hp_cpus=1".
func (c Config) Name() string {
	switch c.Style {
	case lab.StyleNative:
		return "native"
	case StyleGiven:
		return c.Mode
	}
	if c.name != "" {
		return c.name
	}
	return c.Style + "/" + c.Mode
}

// ParseConfig reads "docker", "docker/rps", "native", a mode with options
// ("docker/falcon@split_cpus=1+static=true": options joined by '+', attach's flags with '_'),
// or a stack of modes attached in order ("docker/falcon/prism@hp_cpus=1").
func ParseConfig(s string) (Config, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, "/")
	style := parts[0]
	switch style {
	case lab.StyleDocker, lab.StyleFlannel, lab.StyleNative, lab.StyleLinux, testbed.StyleRealFlannel, testbed.StyleRealFlannelNoCsum, testbed.StyleK8s, testbed.StyleCalico:
	default:
		return Config{}, fmt.Errorf("config %q: unknown style %q (docker, flannel, %s, %s, %s, %s, linux or native)", s, style, testbed.StyleRealFlannel, testbed.StyleRealFlannelNoCsum, testbed.StyleCalico, testbed.StyleK8s)
	}
	c := Config{Style: style, Mode: ModeVanilla}
	var names []string
	for _, part := range parts[1:] {
		mode, opts, hasOpts := strings.Cut(part, "@")
		if mode == "" || mode == ModeVanilla {
			if hasOpts {
				return Config{}, fmt.Errorf("config %q: vanilla takes no options", s)
			}
			if len(parts) > 2 {
				return Config{}, fmt.Errorf("config %q: vanilla cannot be stacked with modes", s)
			}
			continue
		}
		if lab.HostEndpoints(style) {
			return Config{}, fmt.Errorf("config %q: the %s style has no overlay of containers to attach %s to (modes run on docker or flannel)", s, style, mode)
		}
		if _, err := datapath.Lookup(mode); err != nil {
			return Config{}, fmt.Errorf("config %q: %w (or vanilla)", s, err)
		}
		spec := ModeSpec{Mode: mode}
		if hasOpts {
			spec.Extra = map[string]string{}
			for _, kv := range strings.Split(opts, "+") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return Config{}, fmt.Errorf("config %q: option %q is not key=value (e.g. docker/falcon@split_cpus=1+static=true)", s, kv)
				}
				spec.Extra[strings.ReplaceAll(k, "-", "_")] = v
			}
			if err := datapath.CheckOptions(mode, spec.Extra); err != nil {
				return Config{}, fmt.Errorf("config %q: %w", s, err)
			}
		}
		for _, prev := range c.Stack {
			if prev.Mode == mode {
				return Config{}, fmt.Errorf("config %q: mode %s stacked twice", s, mode)
			}
		}
		c.Stack = append(c.Stack, spec)
		names = append(names, mode)
	}
	if len(names) > 0 {
		c.Mode = strings.Join(names, "+")
		c.name = s
	}
	return c, nil
}

// ParseConfigs reads a comma-separated list, rejecting duplicates.
func ParseConfigs(list string) ([]Config, error) {
	var out []Config
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		c, err := ParseConfig(s)
		if err != nil {
			return nil, err
		}
		if seen[c.Name()] {
			return nil, fmt.Errorf("config %s given twice", c.Name())
		}
		seen[c.Name()] = true
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no configuration given")
	}
	return out, nil
}

// ModeConfigs builds the configs of `bench compare --modes a,b --style s`: the native baseline
// first (every ratio is against it), then the style with each mode. The k8s style has no
// native baseline (its pods are kubelet's, there is no host-to-host pair to compare with): its
// first mode is the baseline.
func ModeConfigs(style string, modes []string) ([]Config, error) {
	out := []Config{{Style: lab.StyleNative, Mode: ModeVanilla}}
	if testbed.IsK8s(style) {
		out = nil
	}
	for _, m := range modes {
		if m == lab.StyleNative {
			if testbed.IsK8s(style) {
				return nil, fmt.Errorf("--modes %s: the k8s style has no native baseline (kubelet's pods only); its first mode (vanilla) is the baseline", m)
			}
			continue // always measured, as the baseline; accepted so "--modes native,vanilla,..." reads as meant
		}
		c, err := ParseConfig(style + "/" + m)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}
