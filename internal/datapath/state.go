package datapath

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/statepath"
)

// Paths of peregrine's datapath state. Records live on tmpfs beside the knobs they describe
// (a reboot clears both); pinned eBPF objects live under bpffs. Records, logs and the lock are
// root's alone (0600 in 0700 directories, no symlink followed: internal/safefile), since detach
// acts on what a record says.
var (
	StateDir = statepath.Datapath
	PinRoot  = statepath.Pins
	// AgentLogDir holds the logs of the modes' node agents (agentproc writes them).
	AgentLogDir = statepath.Agents
)

// NodeAgentDir holds the node agents' status files (internal/agent), one per managed target:
// here so that a lab teardown removes those of the namespaces it removes.
var NodeAgentDir = statepath.Agent

// NodeAgentStatus is the status file of the node agent managing target.
func NodeAgentStatus(target string) string {
	return filepath.Join(NodeAgentDir, stateKey(target)+".json")
}

// AgentLog is the log file of a mode's agent for a target.
func AgentLog(mode, target string) string {
	return filepath.Join(AgentLogDir, mode+"-agent-"+stateKey(target)+".log")
}

// State records one attachment: everything needed to undo it from a fresh process.
type State struct {
	Mode     string    `json:"mode"`
	Target   string    `json:"target"` // host namespace; "" = the one peregrine ran in
	Attached time.Time `json:"attached"`
	PID      int       `json:"pid"`
	// Options are the framework's settings of the attach (underlay, CPUs).
	Options Framework `json:"options"`
	// Config is the mode's typed config as Configure returned it (nil for a mode without options).
	Config   json.RawMessage `json:"config,omitempty"`
	Topology *Topology       `json:"topology"`
	Knobs    []Knob          `json:"knobs"`
	Pins     []string        `json:"pins,omitempty"` // paths under PinRoot, removed on detach
	Complete bool            `json:"complete"`       // false while attach is still applying
	// AgentPID is the mode's node agent (a detached process that outlives the CLI), 0 if none.
	AgentPID int `json:"agent_pid,omitempty"`
	// AgentInNode says the mode's agent runs inside the node agent (`peregrine agent --config`):
	// AgentPID is then the node agent's PID, which a detach must never signal.
	AgentInNode bool `json:"agent_in_node,omitempty"`
	// Managed says the node agent attached or adopted this attachment: it keeps it as its
	// config says, and a CLI detach refuses it while the node agent runs (unless --force).
	Managed bool `json:"managed,omitempty"`
	// ModeState is the mode's own record (e.g. which per-device pieces it attached).
	ModeState json.RawMessage `json:"mode_state,omitempty"`
}

func stateKey(target string) string {
	if target == "" {
		return "root"
	}
	return strings.NewReplacer("/", "_").Replace(strings.TrimPrefix(target, "/"))
}

// statePath is the record of one mode on one target: several modes may be stacked on a target
// when they change no knob in common (see Attach).
func statePath(target, mode string) string {
	return filepath.Join(StateDir, stateKey(target)+"."+mode+".json")
}

// SaveState writes a record (a mode saves progress with it, so a crash can still be undone).
func SaveState(st *State) error { return saveState(st) }

func saveState(st *State) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := safefile.WriteFile(statePath(st.Target, st.Mode), b); err != nil {
		return fmt.Errorf("save datapath record: %w", err)
	}
	return nil
}

// LoadState reads the record of one mode on a target; nil, nil if it is not attached there. A
// record made under another name of the same namespace is found too (nsid.go).
func LoadState(target, mode string) (*State, error) {
	p := statePath(target, mode)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		sts, err := LoadStates(target)
		if err != nil {
			return nil, err
		}
		for _, st := range sts {
			if st.Mode == mode {
				p = statePath(st.Target, mode)
			}
		}
	}
	b, err := safefile.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("datapath record %s is corrupt: %w", p, err)
	}
	if err := checkRecord(&st, p); err != nil {
		return nil, err
	}
	return &st, nil
}

// LoadStates returns every mode attached to a target, oldest first: the records of its
// namespace under whatever name they were made (nsid.go).
func LoadStates(target string) ([]*State, error) {
	all, err := AllStates()
	if err != nil {
		return nil, err
	}
	id, idOK := NamespaceID(target)
	var out []*State
	for _, st := range all {
		if st.Target == target {
			out = append(out, st)
		} else if idOK {
			if o, ok := NamespaceID(st.Target); ok && o == id {
				out = append(out, st)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Attached.Before(out[j].Attached) })
	return out, nil
}

func AllStates() ([]*State, error) {
	entries, err := os.ReadDir(StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("the datapath records (%s) are root's alone: run this as root (sudo)", StateDir)
	}
	if err != nil {
		return nil, err
	}
	var out []*State
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(StateDir, e.Name())
		b, err := safefile.ReadFile(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed since the listing
			}
			return nil, err
		}
		var st State
		if json.Unmarshal(b, &st) != nil {
			continue
		}
		if err := checkRecord(&st, p); err != nil {
			return nil, err
		}
		out = append(out, &st)
	}
	return out, nil
}

func removeState(target, mode string) error { return safefile.Remove(statePath(target, mode)) }

const lockWait = 2 * time.Second

// lock serialises attach and detach across processes (flock on a file in StateDir).
func lock() (release func(), err error) {
	f, err := safefile.OpenLock(filepath.Join(StateDir, ".lock"))
	if err != nil {
		return nil, err
	}
	// A mode's agent takes the lock for a few milliseconds when it records a device that came
	// or went; wait that out rather than fail, but not a whole attach of another process.
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another peregrine process is attaching or detaching right now (lock %s held): wait for it and retry", f.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// UpdateState lets a mode's agent change the record of target under the attach/detach lock: fn
// sees the record as saved and may change it; it is saved if fn returns nil. While another
// process holds the lock (an attach or detach in progress) it retries for up to wait.
// ErrNotAttached means the record is gone (the mode was detached).
func UpdateState(target, mode string, wait time.Duration, fn func(*State) error) error {
	deadline := time.Now().Add(wait)
	var release func()
	for {
		var err error
		if release, err = lock(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer release()
	st, err := LoadState(target, mode)
	if err != nil {
		return err
	}
	if st == nil {
		return ErrNotAttached
	}
	if err := fn(st); err != nil {
		return err
	}
	return saveState(st)
}

// ErrNotAttached says there is no record for a target.
var ErrNotAttached = errors.New("nothing is attached")

// PinDir is where a mode pins its objects for a target.
func PinDir(target string) string { return filepath.Join(PinRoot, stateKey(target)) }
