package datapath

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// A record tells detach, run as root, what to write and remove. Its directory is root's alone,
// but a record may still have been tampered with (or written by a buggy build): before anything
// acts on one, what it names must be something peregrine could have made.

var (
	modeName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	// A knob is a device's own attribute or one of its queues' under /sys/class/net (never a
	// path through the device's links, such as device/ or subsystem/), or a network sysctl.
	sysNetKnob  = regexp.MustCompile(`^/sys/class/net/[^/]+/(queues/[rt]x-[0-9]+/)?[a-z0-9_]+$`)
	procNetKnob = regexp.MustCompile(`^/proc/sys/net/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)
)

// checkKnobPath refuses a knob file outside /sys/class/net/DEV[/queues/Q]/FILE and
// /proc/sys/net/...: whatever a record says, detach writes nowhere else.
func checkKnobPath(p string) error {
	if _, _, isLink, err := parseLinkKnob(p); isLink {
		return err
	}
	if filepath.Clean(p) == p && (sysNetKnob.MatchString(p) || procNetKnob.MatchString(p)) {
		return nil
	}
	return fmt.Errorf("knob path %q is not a network knob (/sys/class/net/DEV/[queues/rx-N/]FILE, /proc/sys/net/... or link:DEV/ATTR)", p)
}

// checkRecord refuses a record read from file whose mode name, file name, knobs or pins are not
// what attach writes, with an error that names the record and says what to do.
func checkRecord(st *State, file string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("datapath record %s refused (tampered with?): %s; nothing was changed: inspect it, restore by hand what it lists, and remove it",
			file, fmt.Sprintf(format, a...))
	}
	if !modeName.MatchString(st.Mode) {
		return bad("mode name %q", st.Mode)
	}
	if want := filepath.Base(statePath(st.Target, st.Mode)); filepath.Base(file) != want {
		return bad("it describes %s on %s, whose record is %s", st.Mode, nsLabel(st.Target), want)
	}
	for _, k := range st.Knobs {
		if err := checkKnobPath(k.Path); err != nil {
			return bad("%v", err)
		}
	}
	for _, p := range st.Pins {
		if filepath.Clean(p) != p || !strings.HasPrefix(p, PinRoot+"/") {
			return bad("pin %q is outside %s", p, PinRoot)
		}
	}
	return nil
}
