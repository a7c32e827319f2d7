// Package bench runs peregrine's benchmarks: it builds one lab per configuration (style + datapath
// mode), runs a workload scenario over every point of a sweep, repetitions interleaved across
// configurations (A/B/A/B) so drift hits all alike, samples the probes around every repetition,
// and writes one results.Run. Performance goals are ratios measured side by side in one run.
package bench

import (
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode, for ParseConfig
	"github.com/peregrine-net/peregrine/internal/lab"
)

// ModeVanilla is "nothing attached": the kernel as it comes.
const ModeVanilla = "vanilla"

// Config is one column of a comparison: a lab style with a datapath mode on it, and the
// mode's options (attach flags, e.g. falcon's split_cpus or mflow's batch).
type Config struct {
	Style string
	Mode  string
	Extra map[string]string
	opts  string // the options as written, kept in the name
}

// Name is the config's name in results: "docker/vanilla", "native", "docker/falcon@split_cpus=1".
func (c Config) Name() string {
	switch c.Style {
	case lab.StyleNative:
		return "native"
	case StyleGiven:
		return c.Mode
	}
	if c.opts != "" {
		return c.Style + "/" + c.Mode + "@" + c.opts
	}
	return c.Style + "/" + c.Mode
}

// ParseConfig reads "docker", "docker/rps", "native", or a mode with options:
// "docker/falcon@split_cpus=1+static=true" (options joined by '+', as attach's flags with '_').
func ParseConfig(s string) (Config, error) {
	style, mode, _ := strings.Cut(strings.TrimSpace(s), "/")
	mode, opts, hasOpts := strings.Cut(mode, "@")
	if mode == "" {
		mode = ModeVanilla
	}
	var extra map[string]string
	if hasOpts {
		if mode == ModeVanilla {
			return Config{}, fmt.Errorf("config %q: vanilla takes no options", s)
		}
		extra = map[string]string{}
		for _, kv := range strings.Split(opts, "+") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return Config{}, fmt.Errorf("config %q: option %q is not key=value (e.g. docker/falcon@split_cpus=1+static=true)", s, kv)
			}
			extra[strings.ReplaceAll(k, "-", "_")] = v
		}
	}
	switch style {
	case lab.StyleDocker, lab.StyleFlannel:
	case lab.StyleNative:
		if mode != ModeVanilla {
			return Config{}, fmt.Errorf("config %q: the native style has no overlay to attach %s to", s, mode)
		}
	default:
		return Config{}, fmt.Errorf("config %q: unknown style %q (docker, flannel or native)", s, style)
	}
	if mode != ModeVanilla {
		if _, err := datapath.Lookup(mode); err != nil {
			return Config{}, fmt.Errorf("config %q: %w (or vanilla)", s, err)
		}
	}
	return Config{Style: style, Mode: mode, Extra: extra, opts: opts}, nil
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
// first (every ratio is against it), then the style with each mode.
func ModeConfigs(style string, modes []string) ([]Config, error) {
	out := []Config{{Style: lab.StyleNative, Mode: ModeVanilla}}
	for _, m := range modes {
		c, err := ParseConfig(style + "/" + m)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}
