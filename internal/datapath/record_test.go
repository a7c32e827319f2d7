package datapath

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// useTempState points the records at a private temporary directory for one test.
func useTempState(t *testing.T) {
	t.Helper()
	old := StateDir
	StateDir = filepath.Join(t.TempDir(), "datapath")
	t.Cleanup(func() { StateDir = old })
}

func TestKnobPathsAreNetworkKnobsOnly(t *testing.T) {
	for p, ok := range map[string]bool{
		"/sys/class/net/eth0/queues/rx-0/rps_cpus":       true,
		"/sys/class/net/veth1/queues/rx-12/rps_flow_cnt": true,
		"/sys/class/net/eth0/gro_flush_timeout":          true,
		"/proc/sys/net/core/rps_sock_flow_entries":       true,
		"/proc/sys/net/ipv4/conf/eth0.100/rp_filter":     true,
		"/etc/shadow":                           false,
		"/sys/class/net/eth0/device/remove":     false, // through the device's link
		"/sys/class/net/eth0/../../../kernel/x": false,
		"/sys/class/net/../x/y":                 false,
		"/proc/sys/kernel/core_pattern":         false,
		"/proc/sys/net/../kernel/core_pattern":  false,
		"sys/class/net/eth0/mtu":                false,
		"":                                      false,
		"link:veth1/gso_ipv4_max_size":          true,
		"link:flannel.1/gro_max_size":           true,
		"link:eth0/mtu":                         false, // only the GSO/GRO sizes
		"link:eth0/../gso_max_size":             false,
		"link:a b/gso_max_size":                 false,
		"link:sixteen-chars-xx/gso_max_size":    false,
	} {
		if err := checkKnobPath(p); (err == nil) != ok {
			t.Errorf("%q: %v, want allowed=%v", p, err, ok)
		}
	}
}

// A record whose knob points outside the network knobs (or whose pin is outside the pin root)
// is refused as a whole when read, and writeKnobs never writes such a path.
func TestTamperedRecordRefused(t *testing.T) {
	useTempState(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := &State{Mode: "rps", Target: "prg-tamper-h1",
		Knobs: []Knob{{Netns: "", Path: "/sys/class/net/eth0/queues/rx-0/rps_cpus", Old: "0", New: "3"}}}
	if err := saveState(st); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadStates(st.Target); err != nil || len(got) != 1 {
		t.Fatalf("the untampered record: %v %v", got, err)
	}
	for what, tamper := range map[string]func(s *State){
		"knob path": func(s *State) { s.Knobs[0].Path = victim },
		"pin":       func(s *State) { s.Pins = []string{filepath.Dir(victim)} },
		"pin ..":    func(s *State) { s.Pins = []string{PinRoot + "/../../../etc"} },
		"mode":      func(s *State) { s.Mode = "../x" },
	} {
		bad := *st
		bad.Knobs = append([]Knob(nil), st.Knobs...)
		tamper(&bad)
		b, _ := json.Marshal(&bad)
		if err := os.WriteFile(statePath(st.Target, st.Mode), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadStates(st.Target); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: LoadStates gave %v, want the record refused", what, err)
		}
		if _, err := LoadState(st.Target, st.Mode); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: LoadState gave %v, want the record refused", what, err)
		}
	}
	errs := writeKnobs([]Knob{{Path: victim, Old: "pwned"}}, true)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "not a network knob") {
		t.Errorf("writeKnobs to %s: %v, want refused", victim, errs)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the victim file was written: %q", b)
	}
}

// A symlink planted where a record goes is neither followed on save nor read; the lock file and
// the records are 0600 in a 0700 directory.
func TestRecordFilesPrivateAndNoSymlinks(t *testing.T) {
	useTempState(t)
	st := &State{Mode: "rps", Target: "prg-link-h1"}
	release, err := lock()
	if err != nil {
		t.Fatal(err)
	}
	release()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, statePath(st.Target, st.Mode)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadState(st.Target, st.Mode); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("reading a planted symlink: %v", err)
	}
	if _, err := AllStates(); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("listing with a planted symlink: %v", err)
	}
	if err := saveState(st); err != nil { // replaces the link itself
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("saving followed the planted link: victim now %q", b)
	}
	for p, want := range map[string]os.FileMode{StateDir: 0o700, filepath.Join(StateDir, ".lock"): 0o600,
		statePath(st.Target, st.Mode): 0o600} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want || fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: mode %v, want %o (not a link)", p, fi.Mode(), want)
		}
	}
}
