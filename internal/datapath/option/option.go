// Package option is where a datapath mode declares its options, once. A mode's config struct
// carries each option as a tagged field:
//
//	type Config struct {
//		Threshold int           `opt:"threshold" default:"80" range:"0..100" help:"load threshold in percent"`
//		Interval  time.Duration `opt:"interval" default:"20ms" range:"1ms..10s" help:"load monitor period"`
//		Split     string        `opt:"split" default:"off" enum:"off,on,auto" help:"GRO split"`
//		CPUs      []int         `json:"cpus"` // not an option: filled by the mode from --cpus
//	}
//
// From that one declaration come the CLI's `attach MODE` flags, the bench's config strings
// ("docker/falcon@threshold=85"), the agent's config file, `peregrine options`, the option
// tables of docs/modes and the typed copy kept in the attachment record. Every value is parsed
// and refused here, with one message format, so a typo fails the same way wherever it is typed.
package option

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// Kind is the type of an option's value as people write it.
type Kind string

// The kinds a field's Go type maps to.
const (
	Bool     Kind = "bool"     // true/false (also on/off, yes/no, 1/0)
	Int      Kind = "int"      // a whole number
	Uint     Kind = "uint"     // a whole number ≥ 0
	Float    Kind = "float"    // a decimal number
	String   Kind = "string"   // text, or one of Enum
	Duration Kind = "duration" // 20ms, 1s, 2m
	CPUs     Kind = "cpus"     // a CPU list: 0-3,5
	Rate     Kind = "rate"     // a count per second with k/M/G suffixes: 500k, 10G
	List     Kind = "list"     // repeatable text values (';' between them in one string)
)

// Spec is one declared option.
type Spec struct {
	Key     string   `json:"key"`            // snake_case: records, bench strings, config files
	Kind    Kind     `json:"type"`           // the value's kind
	Default string   `json:"default"`        // as written; "" = the zero value
	Help    string   `json:"help"`           // one sentence for --help and the docs
	Enum    []string `json:"enum,omitempty"` // allowed values of a string option
	Range   string   `json:"range,omitempty"`
	// flag overrides the flag's spelling (a repeatable list reads better singular: --rule).
	flag string
	// alias maps other spellings of an enum value to the value (e.g. full → full-path).
	alias map[string]string
	min   float64
	max   float64
	index []int
}

// Flag is the option's command-line flag without dashes: the key with '-' for '_'.
func (s Spec) Flag() string {
	if s.flag != "" {
		return s.flag
	}
	return strings.ReplaceAll(s.Key, "_", "-")
}

// Schema is the options one mode declares, in declaration order.
type Schema struct {
	Mode  string
	Specs []Spec
	typ   reflect.Type
}

// Declare reads the option fields of cfg, a struct value (or pointer to one). Fields without an
// `opt` tag are not options (the mode fills them itself). A malformed declaration is a
// programmer's error and panics, so every mode's schema is checked the moment its package
// loads (the registry's tests load all of them).
func Declare(mode string, cfg any) *Schema {
	t := reflect.TypeOf(cfg)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		panic(fmt.Sprintf("option.Declare(%s): %v is not a struct", mode, t))
	}
	s := &Schema{Mode: mode, typ: t}
	s.collect(t, nil)
	seen := map[string]bool{}
	for _, sp := range s.Specs {
		if seen[sp.Key] {
			panic(fmt.Sprintf("option.Declare(%s): option %s declared twice", mode, sp.Key))
		}
		seen[sp.Key] = true
		if sp.Default != "" {
			if _, err := sp.parse(sp.Default); err != nil {
				panic(fmt.Sprintf("option.Declare(%s): default of %s: %v", mode, sp.Key, err))
			}
		}
	}
	return s
}

func (s *Schema) collect(t reflect.Type, index []int) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		idx := append(slices.Clone(index), i)
		key, ok := f.Tag.Lookup("opt")
		if !ok {
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				s.collect(f.Type, idx)
			}
			continue
		}
		sp := Spec{Key: key, Default: f.Tag.Get("default"), Help: f.Tag.Get("help"), Range: f.Tag.Get("range"), flag: f.Tag.Get("flag"), index: idx}
		kind, err := kindOf(f.Type, f.Tag.Get("kind"))
		if err != nil {
			panic(fmt.Sprintf("option.Declare(%s): field %s: %v", s.Mode, f.Name, err))
		}
		sp.Kind = kind
		if e := f.Tag.Get("enum"); e != "" {
			sp.Enum = strings.Split(e, ",")
		}
		if a := f.Tag.Get("alias"); a != "" {
			sp.alias = map[string]string{}
			for _, kv := range strings.Split(a, ",") {
				k, v, _ := strings.Cut(kv, "=")
				sp.alias[k] = v
			}
		}
		if sp.Range != "" {
			if sp.min, sp.max, err = parseRange(kind, sp.Range); err != nil {
				panic(fmt.Sprintf("option.Declare(%s): %s range: %v", s.Mode, key, err))
			}
		}
		if key == "" || sp.Help == "" || strings.ContainsAny(key, "- =+@/") {
			panic(fmt.Sprintf("option.Declare(%s): field %s needs a snake_case key and a help text", s.Mode, f.Name))
		}
		s.Specs = append(s.Specs, sp)
	}
}

var durationType = reflect.TypeOf(time.Duration(0))

func kindOf(t reflect.Type, tag string) (Kind, error) {
	switch {
	case tag == string(Rate) && t.Kind() == reflect.Uint64:
		return Rate, nil
	case tag != "":
		return "", fmt.Errorf("kind %q does not fit %v", tag, t)
	case t == durationType:
		return Duration, nil
	}
	switch t.Kind() {
	case reflect.Bool:
		return Bool, nil
	case reflect.Int, reflect.Int32, reflect.Int64:
		return Int, nil
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return Uint, nil
	case reflect.Float64:
		return Float, nil
	case reflect.String:
		return String, nil
	case reflect.Slice:
		switch t.Elem().Kind() {
		case reflect.Int:
			return CPUs, nil
		case reflect.String:
			return List, nil
		}
	}
	return "", fmt.Errorf("type %v cannot be an option", t)
}

// Keys lists the option keys in declaration order.
func (s *Schema) Keys() []string {
	var ks []string
	for _, sp := range s.Specs {
		ks = append(ks, sp.Key)
	}
	return ks
}

// Lookup finds a declared option by key or by flag spelling.
func (s *Schema) Lookup(key string) (Spec, bool) {
	for _, sp := range s.Specs {
		if sp.Key == strings.ReplaceAll(key, "-", "_") || sp.Flag() == key {
			return sp, true
		}
	}
	return Spec{}, false
}

// Validator is a config with checks across options; Parse calls it after every value is set.
type Validator interface{ Validate() error }

// Parse fills a new config from values (key → value as written; flag spellings accepted) over
// the declared defaults, and returns a pointer to it. Unknown keys and ill-typed values are
// refused, all in one error.
func (s *Schema) Parse(values map[string]string) (any, error) {
	ptr := reflect.New(s.typ)
	for _, sp := range s.Specs {
		if sp.Default != "" {
			v, _ := sp.parse(sp.Default)
			setField(ptr.Elem(), sp.index, v)
		}
	}
	if err := s.Check(values); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sp, _ := s.Lookup(k)
		v, _ := sp.parse(values[k])
		setField(ptr.Elem(), sp.index, v)
	}
	if v, ok := ptr.Interface().(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Mode, err)
		}
	}
	return ptr.Interface(), nil
}

// Check refuses unknown keys and values that do not parse, without building a config.
func (s *Schema) Check(values map[string]string) error {
	var unknown []string
	var bad []string
	for k, v := range values {
		sp, ok := s.Lookup(k)
		if !ok {
			unknown = append(unknown, k)
			continue
		}
		if _, err := sp.parse(v); err != nil {
			bad = append(bad, s.valueError(sp, v, err))
		}
	}
	sort.Strings(unknown)
	sort.Strings(bad)
	var msgs []string
	if len(unknown) > 0 {
		takes := "no options"
		if len(s.Specs) > 0 {
			takes = strings.Join(s.Keys(), ", ")
		}
		msgs = append(msgs, fmt.Sprintf("mode %s does not take option(s) %s (it takes: %s)", s.Mode, strings.Join(unknown, ", "), takes))
	}
	msgs = append(msgs, bad...)
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// valueError is the one format of a refused value.
func (s *Schema) valueError(sp Spec, v string, err error) string {
	return fmt.Sprintf("mode %s: option %s (--%s) %q: %v", s.Mode, sp.Key, sp.Flag(), v, err)
}

// Values renders a config's options back as strings (the defaults included), for records,
// status and result labels. cfg is a config value or pointer of this schema's type.
func (s *Schema) Values(cfg any) map[string]string {
	v := reflect.ValueOf(cfg)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	out := map[string]string{}
	for _, sp := range s.Specs {
		out[sp.Key] = sp.format(v.FieldByIndex(sp.index))
	}
	return out
}

// Defaults are the declared defaults (options without one are left out).
func (s *Schema) Defaults() map[string]string {
	out := map[string]string{}
	for _, sp := range s.Specs {
		if sp.Default != "" {
			out[sp.Key] = sp.Default
		}
	}
	return out
}

func setField(v reflect.Value, index []int, x reflect.Value) {
	f := v.FieldByIndex(index)
	f.Set(x.Convert(f.Type()))
}
