package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/statepath"
)

// StateDir holds peregrine's runtime records. It is on tmpfs (/run), like the namespaces and
// knobs it describes: a reboot clears both together.
var StateDir = statepath.Run

func recordPath(name string) string { return filepath.Join(StateDir, "labs", name+".json") }

// writeRecord saves a lab's spec, root's alone (0600 in a 0700 directory, no symlink followed).
func writeRecord(s *Spec) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := safefile.WriteFile(recordPath(s.Name), b); err != nil {
		return fmt.Errorf("write lab record: %w", err)
	}
	return nil
}

// ErrNotUp says a lab does not exist.
var ErrNotUp = errors.New("lab is not up")

func readRecord(name string) (*Spec, error) {
	b, err := safefile.ReadFile(recordPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lab %q: %w (start one with `peregrine lab up`)", name, ErrNotUp)
	}
	if err != nil {
		return nil, err
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab record %s is corrupt (%v): run `peregrine lab down --name %s`", recordPath(name), err, name)
	}
	return &s, nil
}

func removeRecord(name string) error { return safefile.Remove(recordPath(name)) }

// Names lists the labs that have a record or namespaces.
func Names() []string {
	seen := map[string]bool{}
	if entries, err := os.ReadDir(filepath.Join(StateDir, "labs")); err == nil {
		for _, e := range entries {
			if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
				seen[n] = true
			}
		}
	}
	if nss, err := listOurNamespaces(); err == nil {
		for _, ns := range nss {
			rest := strings.TrimPrefix(ns, Prefix)
			if i := strings.Index(rest, "-"); i > 0 {
				seen[rest[:i]] = true
			}
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
