package prism

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// ApplyConfig implements datapath.LiveConfigurer for the node agent: a config whose only change
// is its rules (rules, rules_file) is applied live, as `peregrine prism add/del` would (rules
// kept keep their IDs and counters); any other change (agent, hp_cpus) needs a new attach, and
// nothing is changed.
func (mode) ApplyConfig(_ context.Context, st *datapath.State, next any) (bool, error) {
	nc, ok := next.(Config)
	if !ok {
		return false, fmt.Errorf("prism: config is %T, not prism.Config", next)
	}
	var old Config
	if err := datapath.RecordedConfig(st, &old); err != nil {
		return false, nil
	}
	if old.Agent != nc.Agent || old.HPCPUs != nc.HPCPUs || !reflect.DeepEqual(old.Isolation, nc.Isolation) {
		return false, nil
	}
	text := make([]string, len(nc.Rules))
	for i, r := range nc.Rules {
		text[i] = r.String()
	}
	if _, err := ReplaceRules(st.Target, strings.Join(text, ";")); err != nil {
		return false, err
	}
	b, err := json.Marshal(nc)
	if err != nil {
		return true, err
	}
	return true, datapath.SetConfig(st.Target, Name, b)
}
