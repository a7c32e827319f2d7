package labtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// ScriptLab builds the layout of a lab script that peregrine's lab did not build
// (scripts/handbuilt-*.sh, real-docker-overlay.sh: `SCRIPT up NAME [ARGS...]` and
// `SCRIPT down NAME`), named name, with nodes prg-NAME-n1 .. prg-NAME-nNODES. Its teardown runs
// however the test ends: everything attached to a node is detached, the script takes the
// layout down, testutil.AssertClean finds nothing of prg-NAME- left, then check (nil: none)
// reports what else the layout must not leave. It returns the script's absolute path (for its
// other verbs), the nodes and the output of up (root required).
func ScriptLab(t testing.TB, script, name string, nodes int, check func(), args ...string) (abs string, hosts []string, out string) {
	t.Helper()
	testutil.RequireRoot(t)
	abs, err := filepath.Abs(script)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= nodes; i++ {
		hosts = append(hosts, "prg-"+name+"-n"+strconv.Itoa(i))
	}
	t.Cleanup(func() {
		for _, h := range hosts {
			_, _ = datapath.Detach(context.Background(), h, "")
		}
		if out, err := exec.Command(abs, "down", name).CombinedOutput(); err != nil {
			t.Errorf("%s down %s: %v\n%s", filepath.Base(abs), name, err, out)
		}
		testutil.AssertClean(t, "prg-"+name+"-")
		if check != nil {
			check()
		}
	})
	b, err := exec.Command(abs, append([]string{"up", name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s up %s: %v\n%s", filepath.Base(abs), name, err, b)
	}
	return abs, hosts, string(b)
}

// DetachGone detaches mode from each host and fails the test unless it succeeds and the mode's
// pin directory is gone with it.
func DetachGone(t testing.TB, mode string, hosts ...string) {
	t.Helper()
	for _, h := range hosts {
		if _, err := datapath.Detach(context.Background(), h, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(datapath.ModePinDir(h, mode)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left behind", datapath.ModePinDir(h, mode))
		}
	}
}

// Run runs argv in namespace ns (30 s at most) and returns its output; a failure fails the
// test with the output.
func Run(t testing.TB, ns string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := netnsutil.Run(ctx, ns, argv...)
	if err != nil {
		t.Fatalf("%s: %s: %v\n%s", ns, strings.Join(argv, " "), err, out)
	}
	return out
}
