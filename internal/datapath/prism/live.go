package prism

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
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

// Repair implements datapath.Repairer for the node agent: a recorded tcx link (a VXLAN
// device's, or with hp_cpus an underlay's) that was detached or unpinned by hand is attached
// again, alone; the maps (rules, counters, endpoints) are untouched. A piece whose device is
// gone or renamed is left to the mode's agent, which forgets it.
func (mode) Repair(_ context.Context, st *datapath.State) ([]string, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return nil, err
	}
	var objs *objects
	var back []string
	var errs []error
	for _, p := range ms.Pieces {
		if bpfobj.LinkAlive(p.LinkPin) || !deviceIs(p.Dev) {
			continue
		}
		if objs == nil {
			if objs, err = openPinned(st.Target); err != nil {
				return nil, err
			}
			defer objs.Close()
		}
		_ = bpfobj.DetachPin(p.LinkPin) // a dead link's pin
		prog := objs.PrgPrismVx
		if p.NIC {
			prog = objs.PrgPrismNic
		}
		if err := bpfobj.AttachTCX(prog, p.Dev.Netns, p.Dev.Ifindex, false, p.LinkPin); err != nil {
			errs = append(errs, fmt.Errorf("prism: %s: %w", p.Dev, err))
			continue
		}
		back = append(back, filepath.Base(p.LinkPin))
	}
	// The gate's far end on each pod device (prg_prism_dlv): without it no HP flow toward that
	// pod is ever verified, so prism would stop redirecting to it; put back a link that is gone
	// from a device that is still there. The agent forgets devices that left.
	for _, p := range ms.Pods {
		if bpfobj.LinkAlive(p.LinkPin) || !deviceIs(datapath.Dev{Netns: p.Netns, Name: p.Dev, Ifindex: p.Ifindex}) {
			continue
		}
		if objs == nil {
			if objs, err = openPinned(st.Target); err != nil {
				return back, errors.Join(append(errs, err)...)
			}
			defer objs.Close()
		}
		_ = bpfobj.DetachPin(p.LinkPin)
		if err := attachPod(objs, st.Target, &p); err != nil {
			errs = append(errs, err)
			continue
		}
		back = append(back, filepath.Base(p.LinkPin))
	}
	return back, errors.Join(errs...)
}

// deviceIs tells whether d's ifindex still names d in its namespace.
func deviceIs(d datapath.Dev) bool {
	same := false
	_ = netnsutil.Do(d.Netns, func() error {
		l, err := netlink.LinkByIndex(d.Ifindex)
		same = err == nil && l.Attrs().Name == d.Name
		return nil
	})
	return same
}
