package datapath

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Keys the framework saves in every record's Options (State.Options). They are not mode
// options: a mode never takes them in Options.Extra (--cpus is Options.CPUs).
const (
	OptUnderlay     = "underlay"
	OptCPUs         = "cpus" // Options.CPUs as a CPU list ("0-3,5")
	OptKeepUnderlay = "keep_underlay"
)

var frameworkKeys = []string{OptUnderlay, OptCPUs, OptKeepUnderlay}

// Configurer is a mode with typed settings. Configure parses the options once into the mode's
// config; the framework first refuses any Extra key that is not one of OptionKeys. Attach calls
// it before anything is discovered or changed, hands the result to Knobs and Load in
// Options.Config, and saves it in the record (State.Config), where the mode's agent and its
// status read it back (RecordedConfig). The CLI and the bench go through the same path.
type Configurer interface {
	OptionKeys() []string
	Configure(o Options) (any, error)
}

// OptionKeys lists the Extra keys a mode takes (nil for a mode that does not say).
func OptionKeys(mode string) []string {
	if m, ok := modes[mode].(Configurer); ok {
		return m.OptionKeys()
	}
	return nil
}

// CheckOptionKeys refuses Extra keys mode does not take, and the framework's keys, in one error
// that lists what the mode takes.
func CheckOptionKeys(mode string, extra map[string]string) error {
	m, err := Lookup(mode)
	if err != nil {
		return err
	}
	var bad []string
	for k := range extra {
		if slices.Contains(frameworkKeys, k) {
			return fmt.Errorf("%s: %q is not a mode option: give it to attach itself (--%s)", mode, k, strings.ReplaceAll(k, "_", "-"))
		}
		if c, ok := m.(Configurer); ok && !slices.Contains(c.OptionKeys(), k) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	known := "none"
	if keys := m.(Configurer).OptionKeys(); len(keys) > 0 {
		known = strings.Join(keys, ", ")
	}
	return fmt.Errorf("mode %s does not take option(s) %s (it takes: %s)", mode, strings.Join(bad, ", "), known)
}

// FilterOptions keeps the keys of extra that mode takes (run-wide settings handed to several
// modes); a mode that does not list its keys gets them all.
func FilterOptions(mode string, extra map[string]string) map[string]string {
	c, listed := modes[mode].(Configurer)
	out := map[string]string{}
	for k, v := range extra {
		if !listed || slices.Contains(c.OptionKeys(), k) {
			out[k] = v
		}
	}
	return out
}

// Configure checks o's keys and parses them into mode's typed config (nil for a mode without one).
func Configure(mode string, o Options) (any, error) {
	if err := CheckOptionKeys(mode, o.Extra); err != nil {
		return nil, err
	}
	if c, ok := modes[mode].(Configurer); ok {
		return c.Configure(o)
	}
	return nil, nil
}

// ConfigOf is a mode's typed config inside Knobs or Load: the one the framework parsed
// (Options.Config), or parse(o) when the mode is called directly (tests).
func ConfigOf[C any](o Options, parse func(Options) (C, error)) (C, error) {
	if c, ok := o.Config.(C); ok {
		return c, nil
	}
	return parse(o)
}

// RecordedConfig decodes the typed config saved in a record into v.
func RecordedConfig(st *State, v any) error {
	if len(st.Config) == 0 {
		return fmt.Errorf("%s: the record of %s has no saved config (attached by an older peregrine?): detach and attach again", st.Mode, nsLabel(st.Target))
	}
	if err := json.Unmarshal(st.Config, v); err != nil {
		return fmt.Errorf("%s: the record's config is corrupt: %w", st.Mode, err)
	}
	return nil
}
