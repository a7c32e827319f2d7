package option

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
)

// parse reads one value as written into a reflect.Value of the kind's base type (setField
// converts it to the field's own type), checking the enum and the range.
func (sp Spec) parse(raw string) (reflect.Value, error) {
	s := strings.TrimSpace(raw)
	switch sp.Kind {
	case Bool:
		b, err := parseBool(s)
		return reflect.ValueOf(b), err
	case Int:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return reflect.Value{}, sp.want("a whole number")
		}
		return reflect.ValueOf(n), sp.inRange(float64(n), "a whole number")
	case Uint:
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return reflect.Value{}, sp.want("a whole number ≥ 0")
		}
		return reflect.ValueOf(n), sp.inRange(float64(n), "a whole number")
	case Float:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return reflect.Value{}, sp.want("a number")
		}
		return reflect.ValueOf(f), sp.inRange(f, "a number")
	case Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return reflect.Value{}, sp.want("a duration such as 20ms, 1s or 2m")
		}
		return reflect.ValueOf(d), sp.inRange(float64(d), "a duration")
	case Rate:
		r, err := parseRate(s)
		if err != nil {
			return reflect.Value{}, err
		}
		return reflect.ValueOf(r), sp.inRange(float64(r), "a rate")
	case CPUs:
		if s == "" {
			return reflect.ValueOf([]int(nil)), nil
		}
		cpus, err := cpuset.Parse(s)
		if err != nil {
			return reflect.Value{}, fmt.Errorf("want a CPU list such as 1 or 0-3,5: %w", err)
		}
		return reflect.ValueOf(cpus), nil
	case List:
		var out []string
		for _, item := range strings.Split(s, ";") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
		return reflect.ValueOf(out), nil
	}
	// String.
	if a, ok := sp.alias[s]; ok {
		s = a
	}
	if len(sp.Enum) > 0 && !slices.Contains(sp.Enum, s) {
		return reflect.Value{}, fmt.Errorf("want one of %s", strings.Join(sp.Enum, ", "))
	}
	return reflect.ValueOf(s), nil
}

func (sp Spec) want(what string) error {
	if sp.Range != "" {
		return fmt.Errorf("want %s in %s", what, sp.Range)
	}
	return fmt.Errorf("want %s", what)
}

func (sp Spec) inRange(x float64, what string) error {
	if sp.Range == "" || (x >= sp.min && x <= sp.max) {
		return nil
	}
	return sp.want(what)
}

// format writes a field's value the way parse reads it.
func (sp Spec) format(v reflect.Value) string {
	switch sp.Kind {
	case Duration:
		return time.Duration(v.Int()).String()
	case CPUs:
		return cpuset.Format(v.Interface().([]int))
	case List:
		return strings.Join(v.Interface().([]string), ";")
	}
	return fmt.Sprint(v.Interface())
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "true", "on", "yes", "1":
		return true, nil
	case "false", "off", "no", "0":
		return false, nil
	}
	return false, errors.New("want true or false (on/off)")
}

// parseRate reads "10000", "1.5M", "10G" (k, M, G are powers of 1000).
func parseRate(s string) (uint64, error) {
	mult := 1.0
	t := s
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult, t = 1e3, t[:n-1]
		case 'm', 'M':
			mult, t = 1e6, t[:n-1]
		case 'g', 'G':
			mult, t = 1e9, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*mult > 1e15 {
		return 0, errors.New("want a non-negative rate such as 10000, 500k, 2M or 10G")
	}
	return uint64(f * mult), nil
}

// parseRange reads "lo..hi" in the kind's units.
func parseRange(k Kind, r string) (lo, hi float64, err error) {
	a, b, ok := strings.Cut(r, "..")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not lo..hi", r)
	}
	num := func(s string) (float64, error) {
		switch k {
		case Duration:
			d, err := time.ParseDuration(s)
			return float64(d), err
		case Rate:
			r, err := parseRate(s)
			return float64(r), err
		}
		return strconv.ParseFloat(s, 64)
	}
	if lo, err = num(a); err != nil {
		return 0, 0, err
	}
	if hi, err = num(b); err != nil {
		return 0, 0, err
	}
	return lo, hi, nil
}
