package datapath

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/statepath"
)

// CheckCPUs verifies every CPU is online (cpuset.CheckOnline; kept for callers outside datapath).
func CheckCPUs(cpus []int) error { return cpuset.CheckOnline(cpus) }

// Attach puts a mode on the host namespace target. Nothing is changed unless discovery and
// planning succeed; if applying fails halfway, what was applied is restored.
func Attach(ctx context.Context, target, modeName string, o Options) (*State, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("attach needs root (CAP_NET_ADMIN, CAP_BPF): run it with sudo")
	}
	if err := CheckPinFS(); err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	m, err := Lookup(modeName)
	if err != nil {
		return nil, err
	}
	if target != "" && !netnsutil.Exists(target) {
		return nil, fmt.Errorf("network namespace %q does not exist (see `ip netns list`)", target)
	}
	if err := CheckCPUs(o.CPUs); err != nil {
		return nil, err
	}
	if o.Config, err = Configure(m.Name(), o); err != nil {
		return nil, err
	}
	release, err := lock()
	if err != nil {
		return nil, err
	}
	defer release()
	stacked, err := LoadStates(target)
	if err != nil {
		return nil, err
	}
	for _, st := range stacked {
		as := ""
		if st.Target != target {
			as = fmt.Sprintf(" (the same namespace, attached as %s)", nsLabel(st.Target))
		}
		if st.Mode == m.Name() {
			return nil, fmt.Errorf("mode %s is already attached to %s%s (since %s): run `peregrine detach` first",
				st.Mode, nsLabel(target), as, st.Attached.Format(time.RFC3339))
		}
	}
	if len(stacked) > 0 {
		// One namespace, one name: a mode stacked under another name of the namespace is filed
		// (record, pins) under the name its first attachment used (nsid.go).
		target = stacked[0].Target
	}
	topo, err := Discover(target, o.Underlay)
	if err != nil {
		return nil, err
	}
	knobs, err := m.Knobs(topo, o)
	if err != nil {
		return nil, err
	}
	if err := checkOverlap(m.Name(), knobs, stacked); err != nil {
		return nil, err
	}
	if err := readKnobs(knobs); err != nil {
		return nil, err
	}
	st := &State{Mode: m.Name(), Target: target, Attached: time.Now(), PID: os.Getpid(),
		Options: frameworkOf(o), Topology: topo, Knobs: knobs}
	if o.Config != nil {
		st.Config, _ = json.Marshal(o.Config)
	}
	// The record goes to disk before the first write: a crash from here on is undone by detach.
	if err := saveState(st); err != nil {
		return nil, err
	}
	undo := func(cause error) error {
		errs := []error{cause}
		errs = append(errs, m.Unload(ctx, st))
		errs = append(errs, writeKnobs(knobs, true)...)
		errs = append(errs, removePins(st), removeState(target, st.Mode))
		return errors.Join(errs...)
	}
	if errs := writeKnobs(knobs, false); len(errs) > 0 {
		return nil, undo(errors.Join(errs...))
	}
	crashPoint("after-knobs")
	if err := m.Load(ctx, topo, o, st); err != nil {
		return nil, undo(fmt.Errorf("%s: %w", m.Name(), err))
	}
	st.Complete = true
	if err := saveState(st); err != nil {
		return nil, undo(err)
	}
	return st, nil
}

// Detach undoes the attachments on target from their records, the newest first: programs,
// then knobs, pins, and the record. mode "" means every mode on the target. It works from a new
// process after a crash, and reports every knob it could not restore.
func Detach(ctx context.Context, target, mode string) ([]*State, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("detach needs root: run it with sudo")
	}
	if err := CheckPinFS(); err != nil {
		return nil, fmt.Errorf("detach: %w", err)
	}
	release, err := lock()
	if err != nil {
		return nil, err
	}
	defer release()
	states, err := LoadStates(target)
	if err != nil {
		return nil, err
	}
	var todo []*State
	for i := len(states) - 1; i >= 0; i-- {
		if mode == "" || states[i].Mode == mode {
			todo = append(todo, states[i])
		}
	}
	if len(todo) == 0 {
		if mode != "" {
			return nil, fmt.Errorf("mode %s is not attached to %s", mode, nsLabel(target))
		}
		return nil, fmt.Errorf("nothing is attached to %s", nsLabel(target))
	}
	var errs []error
	for _, st := range todo {
		errs = append(errs, detachState(ctx, st))
	}
	return todo, errors.Join(errs...)
}

// checkOverlap refuses to stack a mode on others that set any of the same knobs: each record
// restores its own old values, so two owners of one knob could not be undone in any order.
func checkOverlap(mode string, knobs []Knob, stacked []*State) error {
	for _, st := range stacked {
		mine := map[string]bool{}
		for _, k := range st.Knobs {
			mine[k.Netns+"\x00"+k.Path] = true
		}
		for _, k := range knobs {
			if mine[k.Netns+"\x00"+k.Path] {
				return fmt.Errorf("mode %s cannot be stacked on %s (attached to %s): both set %s; detach %s first (`peregrine detach --mode %s`)",
					mode, st.Mode, nsLabel(st.Target), k, st.Mode, st.Mode)
			}
		}
	}
	return nil
}

func detachState(ctx context.Context, st *State) error {
	var errs []error
	if m, err := Lookup(st.Mode); err == nil {
		errs = append(errs, m.Unload(ctx, st))
	}
	errs = append(errs, writeKnobs(st.Knobs, true)...)
	errs = append(errs, removePins(st))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach %s from %s restored what it could; record kept at %s for another try: %w",
			st.Mode, nsLabel(st.Target), statePath(st.Target, st.Mode), err)
	}
	return removeState(st.Target, st.Mode)
}

func removePins(st *State) error {
	var errs []error
	for _, p := range st.Pins {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	_ = os.Remove(PinDir(st.Target)) // only if empty
	_ = os.Remove(PinRoot)
	return errors.Join(errs...)
}

// ForgetNamespaces is the datapath's part of a lab teardown (`lab down` passes it to lab.Down):
// attachments whose target namespace is being removed lose their record, pins and agent log
// (their knobs go with the namespace). Attachments to any other namespace, this node's
// included, are never touched, also with all (`lab down --all`): all only adds the pin
// directories and node agent status files left by lab namespaces that are gone (a crashed
// run), recognised by labPrefix, and the pin root itself when nothing else is in it.
func ForgetNamespaces(nss []string, all bool) error {
	gone := map[string]bool{}
	for _, n := range nss {
		gone[n] = true
	}
	states, err := AllStates()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nss { // also the logs of agents whose attach failed before it was recorded
		logs, _ := filepath.Glob(AgentLog("*", n))
		for _, l := range logs {
			errs = append(errs, safefile.Remove(l))
		}
		errs = append(errs, safefile.Remove(NodeAgentStatus(n)))
	}
	kept := map[string]bool{}
	for _, st := range states {
		if !gone[st.Target] {
			kept[stateKey(st.Target)] = true
			continue
		}
		if m, err := Lookup(st.Mode); err == nil {
			errs = append(errs, m.Unload(context.Background(), st))
		}
		errs = append(errs, removePins(st), removeState(st.Target, st.Mode))
	}
	for _, n := range nss {
		if !kept[stateKey(n)] {
			errs = append(errs, os.RemoveAll(PinDir(n)))
		}
	}
	if all {
		ents, _ := os.ReadDir(PinRoot)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), labPrefix) && !kept[e.Name()] {
				errs = append(errs, os.RemoveAll(filepath.Join(PinRoot, e.Name())))
			}
		}
		_ = os.Remove(PinRoot) // only if empty
		sts, _ := filepath.Glob(filepath.Join(NodeAgentDir, labPrefix+"*.json"))
		for _, f := range sts {
			if !kept[strings.TrimSuffix(filepath.Base(f), ".json")] {
				errs = append(errs, safefile.Remove(f))
			}
		}
	}
	return errors.Join(errs...)
}

// labPrefix begins the names of the lab's namespaces (lab.Prefix, the same constant).
const labPrefix = statepath.Prefix
