package deploy

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// capNumbers are the capabilities the manifests may name (linux/capability.h).
var capNumbers = map[string]int{"NET_ADMIN": 12, "SYS_CHROOT": 18, "SYS_ADMIN": 21, "SYS_RESOURCE": 24, "PERFMON": 38, "BPF": 39}

// boundingSet is this process's capability bounding set.
func boundingSet(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no CapBnd in /proc/self/status")
	return 0
}

// TestDaemonSetCapabilitiesSuffice runs attach and detach of modes that load programs (fastpath)
// and write per-namespace knobs (rps) as root holding only the DaemonSet's capabilities, the
// way the container runs, on a lab host; and shows that one of them, SYS_CHROOT, is needed.
// A capability the test machine itself lacks is left out and named in the log.
func TestDaemonSetCapabilitiesSuffice(t *testing.T) {
	testutil.RequireBPF(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) is not installed")
	}
	bin := agentBinary(t)
	var caps []string
	for _, c := range agentContainer(t, daemonSet(t)).SecurityContext.Capabilities.Add {
		caps = append(caps, string(c))
	}
	bnd := boundingSet(t)
	var held []string
	for _, c := range caps {
		n, ok := capNumbers[c]
		if !ok {
			t.Fatalf("capability %s has no number here: add it to capNumbers", c)
		}
		if bnd&(1<<n) != 0 {
			held = append(held, c)
		} else {
			t.Logf("this machine's bounding set lacks %s: tested without it", c)
		}
	}
	l := labtest.Up(t, lab.Spec{Name: "tdcap", Style: lab.StyleFlannel, Containers: 1})
	h1 := labtest.NS(l, "h1")
	run := func(with []string, args ...string) (string, error) {
		set := "-all"
		for _, c := range with {
			set += ",+" + strings.ToLower(c)
		}
		out, err := exec.Command("setpriv", append([]string{"--bounding-set=" + set, "--inh-caps=-all", bin}, args...)...).CombinedOutput()
		return string(out), err
	}
	for _, mode := range []string{"fastpath", "rps"} {
		if out, err := run(held, "attach", mode, "--netns", h1); err != nil {
			t.Fatalf("attach %s with %v: %v\n%s", mode, held, err, out)
		}
	}
	if states, err := datapath.LoadStates(h1); err != nil || len(states) != 2 {
		t.Fatalf("after attach: %d records (%v)", len(states), err)
	}
	if out, err := run(held, "detach", "--netns", h1); err != nil || !strings.Contains(out, "detached rps") || !strings.Contains(out, "detached fastpath") {
		t.Fatalf("detach with %v: %v\n%s", held, err, out)
	}

	without := slices.DeleteFunc(slices.Clone(held), func(c string) bool { return c == "SYS_CHROOT" })
	if len(without) == len(held) {
		t.Fatal("the DaemonSet does not grant SYS_CHROOT")
	}
	out, err := run(without, "attach", "rps", "--netns", h1)
	if err == nil || !strings.Contains(out, "operation not permitted") {
		t.Errorf("attach rps without SYS_CHROOT: %v\n%s\nwant a refusal: then SYS_CHROOT is not needed, drop it from the manifests", err, out)
	}
	if states, _ := datapath.LoadStates(h1); len(states) != 0 {
		t.Errorf("a refused attach left %d record(s)", len(states))
	}
}
