// Package testutil holds helpers shared by peregrine's integration tests: root checks and
// leftover detection (namespaces, links, pins, records) so every test proves it cleaned up.
package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/statepath"
)

// RootEnv set to 1 (scripts/test.sh sets it) turns every skip for want of root into a failure:
// the full suite either tests everything or fails, it never passes having skipped the
// integration tests.
const RootEnv = "PEREGRINE_TEST_ROOT"

// RequireRoot skips the test, saying why, when not root: `go test ./...` as a user runs the
// unit tests and reports the integration ones (namespaces, BPF, labs) as skipped. With
// PEREGRINE_TEST_ROOT=1 it fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(RootEnv) == "1" {
		t.Fatal("needs root (network namespaces, BPF), and " + RootEnv + "=1 forbids skipping: run scripts/test.sh as root")
	}
	t.Skip("needs root (network namespaces, BPF): run as root, as scripts/test.sh does")
}

// Leftovers lists every object with the given name prefix that still exists: named
// namespaces, links in the current namespace, pinned objects and lab/datapath records.
func Leftovers(prefix string) []string {
	var out []string
	if nss, _ := netnsutil.List(prefix); len(nss) > 0 {
		for _, n := range nss {
			out = append(out, "netns "+n)
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, prefix) {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	for _, dir := range []string{statepath.Pins, statepath.Labs, statepath.Datapath} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) || strings.HasPrefix(e.Name(), strings.TrimPrefix(prefix, statepath.Prefix)) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	// Node agents' logs: <mode>-agent-<pin dir named after the target namespace>.log.
	if logs, _ := filepath.Glob(statepath.Agents + "/*-agent-" + prefix + "*.log"); len(logs) > 0 {
		out = append(out, logs...)
	}
	return out
}

// AssertClean fails the test if anything with the prefix is left.
func AssertClean(t testing.TB, prefix string) {
	t.Helper()
	if left := Leftovers(prefix); len(left) > 0 {
		t.Errorf("left behind after teardown: %s", strings.Join(left, ", "))
	}
}

// RequireBPF is RequireRoot plus what loading BPF objects needs (no memlock limit); a kernel
// that cannot load them makes the test fail where it loads them, never skip.
func RequireBPF(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("remove the memlock limit for BPF: %v", err)
	}
}

// RequireCheck fails the test when a kernel capability it needs is missing (check's error says
// which): a missing capability is a broken test machine, not a reason to pass.
func RequireCheck(t testing.TB, what string, check func() error) {
	t.Helper()
	RequireRoot(t)
	if err := check(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Set gives a package variable (a directory, a hook) value v for the rest of the test and
// restores it when the test ends.
func Set[T any](t testing.TB, p *T, v T) {
	t.Helper()
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// LoadObjects loads a set of eBPF objects for program test runs (RequireBPF first), fails the
// test when they do not load, and closes them when the test ends.
func LoadObjects[T interface{ Close() error }](t testing.TB, load func() (T, error)) T {
	t.Helper()
	RequireBPF(t)
	o, err := load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// TempNetns makes a named namespace for the test (root required) and deletes it at the end.
func TempNetns(t testing.TB, name string) {
	t.Helper()
	RequireRoot(t)
	if err := netnsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
}
