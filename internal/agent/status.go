package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// maxErrors is how many of the last errors the status file keeps.
const maxErrors = 10

// Status is what a node agent tells `peregrine status` (and the CLI's attach and detach) about
// itself: written at start, after every reconcile and on a config change.
type Status struct {
	PID           int       `json:"pid"`
	Config        string    `json:"config"`
	ConfigHash    string    `json:"config_hash,omitempty"`
	Target        string    `json:"target"`
	Modes         []string  `json:"modes"`
	Listen        string    `json:"listen,omitempty"`
	Started       time.Time `json:"started"`
	LastReconcile time.Time `json:"last_reconcile,omitzero"`
	Ready         bool      `json:"ready"`
	NotReady      string    `json:"not_ready,omitempty"` // why /readyz answers 503
	ConfigError   string    `json:"config_error,omitempty"`
	Errors        []Event   `json:"errors,omitempty"` // the last few, oldest first
	// Updated is when the agent last wrote this file (after every reconcile: a heartbeat), and
	// Interval its reconcile interval; Stopped is set by an agent that exited normally.
	Updated  time.Time     `json:"updated"`
	Interval time.Duration `json:"interval"`
	Stopped  bool          `json:"stopped,omitempty"`
}

// Event is one logged error.
type Event struct {
	At  time.Time `json:"at"`
	Msg string    `json:"msg"`
}

// StatusFile is the status file of the node agent managing target (one per target: a test may
// run agents for several lab hosts at once). Root's alone, like the records (internal/safefile).
func StatusFile(target string) string { return datapath.NodeAgentStatus(target) }

func writeStatus(s *Status) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	return safefile.WriteFile(StatusFile(s.Target), b)
}

// ReadStatus reads the status file of target's node agent; nil, nil when there is none.
func ReadStatus(target string) (*Status, error) {
	b, err := safefile.ReadFile(StatusFile(target))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s Status
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("node agent status %s is corrupt: %w", StatusFile(target), err)
	}
	return &s, nil
}

// Running tells whether the agent of this status is alive: its PID is a node agent (a
// recycled PID is not), or, for an agent in another PID namespace (a DaemonSet pod without
// hostPID, whose PID means nothing here), it wrote the file within three intervals.
func (s *Status) Running() bool {
	if s == nil || s.Stopped {
		return false
	}
	return agentproc.IsNodeAgent(s.PID) || time.Since(s.Updated) < max(3*s.Interval, 10*time.Second)
}

// NodeAgentRunning tells whether the node agent with pid, managing target, runs: a mode's
// record names the node agent hosting its agent by PID; across PID namespaces the status file's
// heartbeat tells instead. The program hands it to the modes in its datapath.Runtime.
func NodeAgentRunning(pid int, target string) bool {
	if agentproc.IsNodeAgent(pid) {
		return true
	}
	s, err := ReadStatus(target)
	return err == nil && s != nil && s.Running()
}

// Managing is the running node agent that manages target, or nil.
func Managing(target string) *Status {
	s, err := ReadStatus(target)
	if err != nil || !s.Running() {
		return nil
	}
	return s
}

// Format is the status's lines for `peregrine status`.
func (s *Status) Format() string {
	var b strings.Builder
	running := s.Running()
	state := "running"
	switch {
	case s.Stopped:
		state = "stopped (the datapath stays as it was; the next agent adopts it)"
	case !running:
		state = "NOT RUNNING (killed or crashed; the datapath stays as it was; start the agent again and it adopts it)"
	}
	fmt.Fprintf(&b, "node agent on %s: pid %d, %s\n", netnsutil.Label(s.Target), s.PID, state)
	fmt.Fprintf(&b, "  config    %s (modes: %s)\n", s.Config, strings.Join(s.Modes, ", "))
	if running {
		fmt.Fprintf(&b, "  uptime    %s (since %s)\n", time.Since(s.Started).Round(time.Second), s.Started.Format(time.RFC3339))
	}
	if !s.LastReconcile.IsZero() {
		fmt.Fprintf(&b, "  reconcile %s ago\n", time.Since(s.LastReconcile).Round(time.Millisecond))
	}
	switch {
	case !running:
	case s.Ready:
		fmt.Fprintf(&b, "  ready     yes\n")
	default:
		fmt.Fprintf(&b, "  ready     no: %s\n", s.NotReady)
	}
	if s.ConfigError != "" {
		fmt.Fprintf(&b, "  config refused (running state kept): %s\n", s.ConfigError)
	}
	for _, e := range s.Errors {
		fmt.Fprintf(&b, "  error     %s %s\n", e.At.Format("15:04:05"), e.Msg)
	}
	return b.String()
}

// AllStatuses reads every node agent's status file (running or not), by target.
func AllStatuses() ([]*Status, error) {
	ents, err := os.ReadDir(datapath.NodeAgentDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Status
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := safefile.ReadFile(filepath.Join(datapath.NodeAgentDir, e.Name()))
		if err != nil {
			continue
		}
		var s Status
		if json.Unmarshal(b, &s) == nil {
			out = append(out, &s)
		}
	}
	return out, nil
}

// RefuseManaged is the error for a CLI change to a target a running node agent manages.
func RefuseManaged(s *Status, what string) error {
	return fmt.Errorf("the node agent (pid %d, config %s) manages %s: %s would be undone on its next reconcile. Change its config (remove the mode, then SIGHUP or let it see the file change), or stop it (systemctl stop peregrine-agent, or remove the DaemonSet from the node); --force does it anyway",
		s.PID, s.Config, netnsutil.Label(s.Target), what)
}
