package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	"github.com/peregrine-net/peregrine/internal/datapath/prism"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

func fastHits(t *testing.T, host string) uint64 {
	t.Helper()
	v, err := fastpath.Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	return v.Egress["hit"] + v.Ingress["hit"]
}

func prismRules(t *testing.T, host string) []string {
	t.Helper()
	v, err := prism.Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range v.Rules {
		out = append(out, r.Rule)
	}
	return out
}

// TestAgentAcrossKillRestartAndReload is the integration test on a flannel lab with a
// node agent per host (each a process of its own): a TCP transfer and a 64 B ping-pong through
// the fast path run across kill -9 of both agents, their restart as an upgrade (h1's receive
// program is an older one, swapped in place on adoption) and a SIGHUP with changed prism rules. While the agents are down the fast path keeps hitting; the restarted agents adopt what
// is attached (same tcx links, same flow map: nothing detached or attached); the reload changes
// prism's rules live and leaves fastpath alone. At the end: no TCP reset, no ping-pong gap over
// 100 ms, the transfer complete.
func TestAgentAcrossKillRestartAndReload(t *testing.T) {
	testutil.RequireBPF(t)
	l := labtest.Up(t, lab.Spec{Name: "tagt", Style: lab.StyleFlannel, Containers: 1})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	dst := netip.MustParsePrefix(c2.Addr).Addr()
	dir := t.TempDir()
	modes := func(rule string) string {
		return "  fastpath: {}\n  prism:\n    rules: [\"" + rule + "\"]\n"
	}
	var agents []*agentProc
	cfgs := make([]string, len(hosts))
	for i, h := range hosts {
		cfgs[i] = filepath.Join(dir, fmt.Sprintf("h%d.yaml", i+1))
		port := freePort(t)
		writeConfig(t, cfgs[i], modes("proto=udp dport=9"), port)
		agents = append(agents, startAgent(t, cfgs[i], h, port))
	}
	labtest.DetachAtEnd(t, hosts...) // before the lab goes (LIFO): the agents are dead by then
	for _, a := range agents {
		a.waitReady(t, 20*time.Second)
	}

	resetsBefore := tcpResets(t, c1.Netns) + tcpResets(t, c2.Netns)
	stream := labtest.StartTCP(t, c1.Netns, c2.Netns, netip.AddrPortFrom(dst, 5301), time.Millisecond)
	pp := labtest.StartPingPong(t, c1.Netns, c2.Netns, netip.AddrPortFrom(dst, 5302))
	stream.WaitFlowing(t, 1<<20, 5*time.Second)
	labtest.Eventually(t, 3*time.Second, "the transfer takes the fast path", func() (bool, string) {
		h := fastHits(t, hosts[0])
		return h > 100, fmt.Sprintf("%d hits", h)
	})
	links := map[string]map[string]string{}
	flowMaps := map[string]string{}
	attached := map[string]time.Time{}
	snapshot := func(h string) (map[string]string, string) {
		ids := map[string]string{}
		for k, v := range linkIDs(t, h, fastpath.Name) {
			ids[k] = fmt.Sprint(v)
		}
		return ids, fmt.Sprint(mapID(t, h, fastpath.Name, "prg_fastpath_flow"))
	}
	for _, h := range hosts {
		links[h], flowMaps[h] = snapshot(h)
		st, _ := datapath.LoadState(h, fastpath.Name)
		attached[h] = st.Attached
	}
	same := func(when string) {
		t.Helper()
		for _, h := range hosts {
			ids, fm := snapshot(h)
			st, err := datapath.LoadState(h, fastpath.Name)
			if err != nil || st == nil {
				t.Fatalf("%s: %s: fastpath record gone: %v", when, h, err)
			}
			if !maps.Equal(ids, links[h]) || fm != flowMaps[h] || !st.Attached.Equal(attached[h]) {
				t.Errorf("%s: %s: fastpath was detached or attached again: links %v -> %v, flow map %s -> %s, attached %s -> %s",
					when, h, links[h], ids, flowMaps[h], fm, attached[h], st.Attached)
			}
		}
	}

	before, err := fastpath.Inspect(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	// kill -9: the fast path keeps forwarding while no agent runs.
	for _, a := range agents {
		a.kill9(t)
	}
	downHits := fastHits(t, hosts[0])
	time.Sleep(time.Second)
	hitsWhileDown := fastHits(t, hosts[0]) - downHits
	if hitsWhileDown == 0 {
		t.Errorf("no fast-path hit in the second the agents were down")
	}
	same("after kill -9")

	// Restart with a newer binary, as it were: h1's receive program is an older one (on its
	// link and pin) and the restarted agent swaps this binary's in, on the same link.
	older := installOlderRx(t, hosts[0])
	// Restart: the new agents adopt; nothing is detached or attached.
	for i, h := range hosts {
		agents[i] = startAgent(t, cfgs[i], h, agents[i].port)
	}
	for _, a := range agents {
		a.waitReady(t, 20*time.Second)
	}
	same("after the restart")
	older.check(t)
	if v, err := fastpath.Inspect(hosts[0]); err != nil || v.Flows < before.Flows {
		t.Errorf("the restarted agent forgot cached flows: %d before, %v %v", before.Flows, v, err)
	}
	for _, a := range agents {
		if !strings.Contains(a.Log.String(), "adopted") {
			t.Errorf("the restarted agent did not adopt:\n%s", a.Log.String())
		}
		if strings.Contains(a.Log.String(), "overlay changed") {
			t.Errorf("the restarted agent took the unchanged overlay for a changed one (and forgot the flows):\n%s", a.Log.String())
		}
	}

	// SIGHUP with changed prism rules: changed live, fastpath untouched.
	for i, a := range agents {
		writeConfig(t, cfgs[i], modes("proto=udp dport=19"), a.port)
		_ = a.Cmd.Process.Signal(syscall.SIGHUP)
	}
	for _, h := range hosts {
		labtest.Eventually(t, 3*time.Second, "prism's rules changed live", func() (bool, string) {
			r := prismRules(t, h)
			return len(r) == 1 && strings.Contains(r[0], "dport=19"), strings.Join(r, "; ")
		})
	}
	for _, a := range agents {
		a.waitReady(t, 5*time.Second)
		if strings.Contains(a.Log.String(), "detaching and attaching again") {
			t.Errorf("a mode was detached and attached on reload:\n%s", a.Log.String())
		}
	}
	same("after the reload")
	if v, err := fastpath.Inspect(hosts[0]); err != nil || v.Flows == 0 {
		t.Errorf("fastpath's flows after the reload: %v %v", v, err)
	}
	stream.WaitFlowing(t, 1<<20, 5*time.Second)

	ppErr := pp.Finish()
	carried := stream.Finish(t)
	resets := tcpResets(t, c1.Netns) + tcpResets(t, c2.Netns) - resetsBefore
	gap := pp.MaxGap()
	t.Logf("figures: TCP %d bytes, %d resets; ping-pong %d rounds, max gap %v; fast-path hits while the agents were down (1 s): %d",
		carried, resets, pp.Rounds(), gap.Round(time.Microsecond), hitsWhileDown)
	if ppErr != nil {
		t.Errorf("ping-pong broke: %v", ppErr)
	}
	if resets != 0 {
		t.Errorf("%d TCP resets", resets)
	}
	if gap > 100*time.Millisecond {
		t.Errorf("ping-pong gap %v, want <= 100ms", gap)
	}
	for _, a := range agents {
		a.stop(t)
	}
	for _, h := range hosts {
		if sts, _ := datapath.LoadStates(h); len(sts) != 2 {
			t.Errorf("%s: %d attachments after SIGTERM, want both left in place", h, len(sts))
		}
	}
}
