// Package doctor checks what a node needs for peregrine and what it has: the kernel and its
// eBPF features, the filesystems the agent pins and probes through, the overlay discovery finds
// and settings along its path known to break or slow it (MTUs, checksum offload, BIG TCP).
// Every check says what it found and, when it is not ok, what to do. `peregrine doctor` prints
// them; the agent runs them at start and reports them on /readyz.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is a check's verdict.
type Status string

// The verdicts, from good to bad. Fail means something peregrine requires is missing or
// broken (Required refuses); Warn works but is known to hurt; Skip could not be checked
// because something it depends on failed.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Check is one finding.
type Check struct {
	Name   string `json:"name"`
	Target string `json:"target,omitempty"` // the host namespace of an overlay check ("" = this node's)
	Status Status `json:"status"`
	Detail string `json:"detail"`        // what was found
	Fix    string `json:"fix,omitempty"` // what to do about a warn or fail
}

// Target is the node whose overlay the overlay checks look at.
type Target struct {
	Netns    string // host network namespace, by name or path; "" = the current one
	Underlay string // the underlay device, when discovery cannot tell it (attach's --underlay)
}

// Run runs every check: the node's (kernel, features, filesystems, privileges), then the
// overlay's behind target. The error is for a failure to run the checks at all (a cancelled
// context); a failed check is a Check with status Fail (see Required).
func Run(ctx context.Context, target Target) ([]Check, error) {
	checks := NodeChecks()
	if err := ctx.Err(); err != nil {
		return checks, err
	}
	checks = append(checks, OverlayChecks(target)...)
	return checks, ctx.Err()
}

// Required returns an error naming every failed check (nil when none failed).
func Required(checks []Check) error {
	var msgs []string
	for _, c := range checks {
		if c.Status == Fail {
			m := c.Name + ": " + c.Detail
			if c.Target != "" {
				m = c.Target + " " + m
			}
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%d required check(s) failed: %s", len(msgs), strings.Join(msgs, "; "))
}

// ErrFailed is wrapped by the CLI's error when a required check failed.
var ErrFailed = errors.New("node is not ready for peregrine")

// Write prints the checks as a table for people: one line per check, and the fix indented
// under each that needs one.
func Write(w io.Writer, checks []Check) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tFOUND")
	for _, c := range checks {
		name := c.Name
		if c.Target != "" {
			name += " (" + c.Target + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, strings.ToUpper(string(c.Status)), c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(tw, "\t\t-> %s\n", c.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var n [4]int
	for _, c := range checks {
		switch c.Status {
		case OK:
			n[0]++
		case Warn:
			n[1]++
		case Fail:
			n[2]++
		case Skip:
			n[3]++
		}
	}
	_, err := fmt.Fprintf(w, "\n%d ok, %d warn, %d fail, %d skipped\n", n[0], n[1], n[2], n[3])
	return err
}
