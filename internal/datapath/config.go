package datapath

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// Keys of the framework's own settings. They are not mode options: a mode never declares
// them, and giving one as a mode option is refused with the attach flag to use instead.
const (
	OptUnderlay     = "underlay"
	OptCPUs         = "cpus" // Options.CPUs as a CPU list ("0-3,5")
	OptKeepUnderlay = "keep_underlay"
)

var frameworkKeys = []string{OptUnderlay, OptCPUs, OptKeepUnderlay}

// Framework is the record's copy of the settings every mode shares (Options without the
// mode's own, which the record keeps typed in State.Config).
type Framework struct {
	Underlay     string `json:"underlay,omitempty"`
	CPUs         []int  `json:"cpus,omitempty"`
	KeepUnderlay bool   `json:"keep_underlay,omitempty"`
}

func frameworkOf(o Options) Framework {
	return Framework{Underlay: o.Underlay, CPUs: slices.Clone(o.CPUs), KeepUnderlay: o.KeepUnderlay}
}

// Schema is a mode's option declaration (option.Declare); a mode without options has an empty one.
func Schema(mode string) (*option.Schema, error) {
	m, err := Lookup(mode)
	if err != nil {
		return nil, err
	}
	if s := m.Options(); s != nil {
		return s, nil
	}
	return &option.Schema{Mode: mode}, nil
}

// CheckOptions refuses what a mode would refuse of extra before anything runs: the framework's
// keys, keys the mode does not declare and values that do not parse (one message format).
func CheckOptions(mode string, extra map[string]string) error {
	s, err := Schema(mode)
	if err != nil {
		return err
	}
	for k := range extra {
		if slices.Contains(frameworkKeys, strings.ReplaceAll(k, "-", "_")) {
			return fmt.Errorf("%s: %q is not a mode option: give it to attach itself (--%s)", mode, k, strings.ReplaceAll(k, "_", "-"))
		}
	}
	return s.Check(extra)
}

// FilterOptions keeps the keys of extra that mode declares (run-wide settings handed to several
// modes).
func FilterOptions(mode string, extra map[string]string) map[string]string {
	out := map[string]string{}
	s, err := Schema(mode)
	if err != nil {
		return out
	}
	for k, v := range extra {
		if _, ok := s.Lookup(k); ok {
			out[k] = v
		}
	}
	return out
}

// Configure parses o.Extra into mode's typed config (a value of the mode's config type; nil for
// a mode without options), completes it with the framework's settings and returns it. Attach
// calls it before anything is discovered or changed, hands the result to Knobs and Load in
// Options.Config and saves it in the record (State.Config). The CLI, the bench and the agent's
// config file all come through here.
func Configure(mode string, o Options) (any, error) {
	if err := CheckOptions(mode, o.Extra); err != nil {
		return nil, err
	}
	m, _ := Lookup(mode)
	s := m.Options()
	if s == nil {
		return nil, nil
	}
	ptr, err := s.Parse(o.Extra)
	if err != nil {
		return nil, err
	}
	if c, ok := ptr.(Completer); ok {
		if err := c.Complete(o); err != nil {
			if strings.HasPrefix(err.Error(), mode+":") {
				return nil, err
			}
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
	}
	return reflect.ValueOf(ptr).Elem().Interface(), nil
}

// ConfigOf is a mode's typed config inside Knobs or Load: the one the framework parsed
// (Options.Config), or parsed here when the mode is called directly (tests).
func ConfigOf[C any](mode string, o Options) (C, error) {
	if c, ok := o.Config.(C); ok {
		return c, nil
	}
	var zero C
	v, err := Configure(mode, o)
	if err != nil {
		return zero, err
	}
	c, ok := v.(C)
	if !ok {
		return zero, fmt.Errorf("%s: config is %T, not %T", mode, v, zero)
	}
	return c, nil
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
