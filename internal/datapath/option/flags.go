package option

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Bind declares the schema's options as flags on fs (--threshold, --split-cpus, ...) and
// returns a function that collects the flags given on the command line as values for Parse.
// A value is checked as the flag is read, so `--threshold abc` fails with the same message
// that a bench string or a config file would get.
func (s *Schema) Bind(fs *pflag.FlagSet) func() map[string]string {
	vals := map[string]*flagValue{}
	for _, sp := range s.Specs {
		if sp.Flag() == "-" {
			continue // set by the caller (e.g. ezpath's lab from attach --lab)
		}
		fv := &flagValue{schema: s, spec: sp}
		fl := fs.VarPF(fv, sp.Flag(), "", sp.Help+enumHint(sp))
		fl.DefValue = sp.Default
		if sp.Kind == Bool {
			fl.NoOptDefVal = "true"
		}
		vals[sp.Key] = fv
	}
	return func() map[string]string {
		out := map[string]string{}
		for k, fv := range vals {
			if fv.set {
				out[k] = strings.Join(fv.given, ";")
			}
		}
		return out
	}
}

func enumHint(sp Spec) string {
	switch {
	case len(sp.Enum) > 0:
		return " (" + strings.Join(sp.Enum, "|") + ")"
	case sp.Range != "":
		return " (" + sp.Range + ")"
	}
	return ""
}

// flagValue is one option as a pflag.Value: it keeps the text as given (lists repeat).
type flagValue struct {
	schema *Schema
	spec   Spec
	given  []string
	set    bool
}

func (f *flagValue) String() string {
	if !f.set {
		return f.spec.Default
	}
	return strings.Join(f.given, ";")
}

func (f *flagValue) Set(v string) error {
	if _, err := f.spec.parse(v); err != nil {
		return fmt.Errorf("%s", f.schema.valueError(f.spec, v, err))
	}
	if f.spec.Kind != List {
		f.given = f.given[:0]
	}
	f.given = append(f.given, v)
	f.set = true
	return nil
}

func (f *flagValue) Type() string { return string(f.spec.Kind) }
