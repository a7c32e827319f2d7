package agent

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Uninstall removes everything peregrine put on this machine: every attachment is detached
// (programs, knobs written back, pins, records), then the pin root and peregrine's state under
// /run/peregrine (records, agent logs, node agent status files). A running node agent would
// attach again: it is refused unless force.
func Uninstall(ctx context.Context, force bool) ([]*datapath.State, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("uninstall needs root: run it with sudo")
	}
	sts, err := AllStatuses()
	if err != nil {
		return nil, err
	}
	if holder := lockedByAgent(); holder != "" && !force {
		return nil, fmt.Errorf("a node agent (%s) is running and would attach again: stop it first (systemctl stop peregrine-agent, or delete the DaemonSet), or give --force", holder)
	}
	for _, s := range sts {
		if s.Running() && !force {
			return nil, fmt.Errorf("a node agent (pid %d, config %s) is running and would attach again: stop it first (systemctl stop peregrine-agent, or delete the DaemonSet), or give --force", s.PID, s.Config)
		}
	}
	states, err := datapath.AllStates()
	if err != nil {
		return nil, err
	}
	// One detach per namespace: records an older peregrine filed under two names of one
	// namespace are both found by either name (datapath/nsid.go).
	seen := map[string]bool{}
	var done []*datapath.State
	var errs []error
	for _, st := range states {
		key := st.Target
		if id, ok := datapath.NamespaceID(st.Target); ok {
			key = id
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		d, err := datapath.Detach(ctx, st.Target, "")
		done = append(done, d...)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return done, fmt.Errorf("%w (records kept for another try; nothing else removed)", err)
	}
	for _, dir := range []string{datapath.PinRoot, datapath.StateDir, datapath.AgentLogDir, datapath.NodeAgentDir} {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}

// Leftovers lists what peregrine still has on this machine: each attachment on record, the pin
// root, the state directories. Empty after a complete Uninstall (`peregrine uninstall --check`:
// the uninstall DaemonSet's readiness, so that `kubectl rollout status` says every node is clean).
func Leftovers() ([]string, error) {
	var out []string
	states, err := datapath.AllStates()
	if err != nil {
		return nil, err
	}
	for _, st := range states {
		out = append(out, fmt.Sprintf("attachment %s on %s", st.Mode, netnsutil.Label(st.Target)))
	}
	for _, dir := range []string{datapath.PinRoot, datapath.StateDir, datapath.AgentLogDir, datapath.NodeAgentDir} {
		if _, err := os.Lstat(dir); err == nil {
			out = append(out, dir)
		}
	}
	return out, nil
}
