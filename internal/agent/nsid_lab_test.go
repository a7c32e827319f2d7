package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// Item 8: one namespace under two names (`--netns prg-x-h1`, then `--netns /run/netns/prg-x-h1`)
// is one target. Before, the second attach made a second attachment (its record under the path),
// and detaching both left nf_conntrack_tcp_be_liberal at 1: the second had read 1 as the old
// value. Now the second attach of a mode is refused as already attached, naming the first; a
// mode stacked under the other name is filed under the first name; a detach by either name
// finds them; and every knob is back at its value of before.
func TestOneNamespaceUnderTwoNamesIsOneTarget(t *testing.T) {
	testutil.RequireBPF(t)
	l := labtest.Up(t, lab.Spec{Name: "tnsid", Style: lab.StyleFlannel, Containers: 1})
	h1 := l.Hosts[0].Netns
	alias := filepath.Join("/run/netns", h1) // /var/run is /run: another path to the same file
	if _, err := os.Stat(alias); err != nil {
		alias = netnsutil.Path(h1)
	}
	labtest.PrivateState(t, "tnsid")
	labtest.DetachAtEnd(t, h1, alias)
	const liberal = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
	before, err := netnsutil.ReadFileIn(h1, liberal)
	if err != nil {
		t.Fatal(err)
	}
	noAgent := datapath.Options{Extra: map[string]string{fastpath.OptAgent: "false"}}
	st, err := datapath.Attach(context.Background(), h1, fastpath.Name, noAgent)
	if err != nil {
		t.Fatal(err)
	}
	_, err = datapath.Attach(context.Background(), alias, fastpath.Name, noAgent)
	if err == nil || !strings.Contains(err.Error(), "already attached") || !strings.Contains(err.Error(), h1) {
		t.Fatalf("attach under a second name %s: %v, want refused as already attached (as %s)", alias, err, h1)
	}
	rps, err := datapath.Attach(context.Background(), alias, "rps", datapath.Options{})
	if err != nil {
		t.Fatalf("rps stacked under %s: %v", alias, err)
	}
	if rps.Target != h1 {
		t.Errorf("rps stacked under %s is filed under %q, want the first name %q", alias, rps.Target, h1)
	}
	for _, name := range []string{h1, alias} {
		if sts, err := datapath.LoadStates(name); err != nil || len(sts) != 2 {
			t.Errorf("LoadStates(%s): %d records, %v; want 2", name, len(sts), err)
		}
	}
	done, err := datapath.Detach(context.Background(), alias, "")
	if err != nil || len(done) != 2 {
		t.Fatalf("detach by %s: %d detached, %v", alias, len(done), err)
	}
	if _, err := datapath.Detach(context.Background(), h1, ""); err == nil {
		t.Error("a second detach by the first name found something left")
	}
	for _, k := range append(st.Knobs, rps.Knobs...) {
		if live := datapath.CurrentValue(k); !datapath.SameValue(live, k.Old) {
			t.Errorf("%s: %q after detach, want %q", k, live, k.Old)
		}
	}
	if after, _ := netnsutil.ReadFileIn(h1, liberal); strings.TrimSpace(after) != strings.TrimSpace(before) {
		t.Errorf("nf_conntrack_tcp_be_liberal: %q after detach, %q before", after, before)
	}
}
