package option

import (
	"fmt"
	"sort"
	"strings"
)

// Markdown is the schema as the option table of the mode's page in docs/modes: key, flag,
// type, default and what it does (`peregrine options MODE --markdown` prints it).
func (s *Schema) Markdown() string {
	if len(s.Specs) == 0 {
		return fmt.Sprintf("Mode %s takes no options of its own (only attach's `--cpus`, `--underlay`).\n", s.Mode)
	}
	var b strings.Builder
	b.WriteString("| option | flag | type | default | what it does |\n|---|---|---|---|---|\n")
	for _, sp := range s.Specs {
		typ := string(sp.Kind)
		if len(sp.Enum) > 0 {
			typ = strings.Join(sp.Enum, " \\| ")
		} else if sp.Range != "" {
			typ += " " + sp.Range
		}
		def := sp.Default
		if def == "" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		flag := "`--" + sp.Flag() + "`"
		if sp.Flag() == "-" {
			flag = "—"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", sp.Key, flag, typ, def, strings.ReplaceAll(sp.Help, "|", "\\|"))
	}
	return b.String()
}

// FromAny turns a decoded config-file map (YAML or JSON: scalars and lists of scalars) into
// values for Parse. Nested maps are refused with the key's path.
func FromAny(m map[string]any) (map[string]string, error) {
	out := map[string]string{}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch v := m[k].(type) {
		case nil:
		case []any:
			var items []string
			for i, it := range v {
				s, err := scalar(it)
				if err != nil {
					return nil, fmt.Errorf("%s[%d]: %w", k, i, err)
				}
				items = append(items, s)
			}
			out[k] = strings.Join(items, ";")
		default:
			s, err := scalar(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = s
		}
	}
	return out, nil
}

func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(x), nil
	}
	return "", fmt.Errorf("want a value or a list of values, not %T", v)
}
