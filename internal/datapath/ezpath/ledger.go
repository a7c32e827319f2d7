package ezpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/safefile"
)

// LedgerDir holds one ledger per lab: which container pairs are offloaded (authoritative; the
// tables mirror it) and the controller's last view of the flows. Every change of the offload
// tables happens under the ledger's lock, whoever makes it (CLI, agent, detach).
var LedgerDir = "/run/peregrine/ezpath"

// Pair is an offloaded (or refused) pair of containers, both directions.
type Pair struct {
	A     string    `json:"a"`
	B     string    `json:"b"`
	By    string    `json:"by"` // auto | manual
	Since time.Time `json:"since"`
	Note  string    `json:"note,omitempty"`
}

func (p Pair) same(a, b string) bool { return (p.A == a && p.B == b) || (p.A == b && p.B == a) }

// Ledger is a lab's offload record.
type Ledger struct {
	Lab     string     `json:"lab"`
	Pairs   []Pair     `json:"pairs"`
	Refused []Pair     `json:"refused,omitempty"` // candidates left on the overlay, with why
	Flows   []FlowView `json:"flows,omitempty"`   // the controller's last poll
	Polled  time.Time  `json:"polled,omitempty"`
}

func ledgerPath(lab string) string { return filepath.Join(LedgerDir, lab+".json") }

// ReadLedger returns the lab's ledger (empty if there is none).
func ReadLedger(lab string) (*Ledger, error) {
	b, err := safefile.ReadFile(ledgerPath(lab))
	if errors.Is(err, os.ErrNotExist) {
		return &Ledger{Lab: lab}, nil
	}
	if err != nil {
		return nil, err
	}
	var l Ledger
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("ezpath: ledger %s is corrupt: %w", ledgerPath(lab), err)
	}
	return &l, nil
}

func writeLedger(l *Ledger) error {
	b, _ := json.MarshalIndent(l, "", "  ")
	return safefile.WriteFile(ledgerPath(l.Lab), b)
}

// withLedger runs fn on the lab's ledger under its lock and saves it when fn returns nil.
func withLedger(lab string, fn func(*Ledger) error) error {
	f, err := safefile.OpenLock(filepath.Join(LedgerDir, lab+".lock"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	l, err := ReadLedger(lab)
	if err != nil {
		return err
	}
	if err := fn(l); err != nil {
		return err
	}
	return writeLedger(l)
}

// removeLedger forgets a lab's ledger (the last host detached).
func removeLedger(lab string) error {
	var errs []error
	for _, p := range []string{ledgerPath(lab), filepath.Join(LedgerDir, lab+".lock")} {
		errs = append(errs, safefile.Remove(p))
	}
	_ = os.Remove(LedgerDir) // only if empty
	return errors.Join(errs...)
}
