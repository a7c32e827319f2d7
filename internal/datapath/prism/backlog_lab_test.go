package prism

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The point of the sync path: HP packets never enter the container veth's backlog. The stage
// probe counts netif_rx enqueues per device; vanilla puts every datagram of the flow there,
// prism none.
func TestHPSkipsTheVethBacklog(t *testing.T) {
	testutil.RequireCheck(t, "stage probe", stage.Check)
	l := labtest.Up(t, lab.Spec{Name: "tprbl", Style: lab.StyleDocker, Containers: 1})
	src, err := l.Node("h1-c1")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := l.Node("h2-c1")
	if err != nil {
		t.Fatal(err)
	}
	udpEcho(t, dst.Netns, dst.AddrOnly(), hpPort)
	ino, err := netnsutil.Inode(netnsutil.Path(dst.Netns))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := netnsutil.ReadFileIn(dst.Netns, "/sys/class/net/eth0/ifindex")
	if err != nil {
		t.Fatal(err)
	}
	ifindex, err := strconv.Atoi(strings.TrimSpace(idx))
	if err != nil {
		t.Fatal(err)
	}
	key := stage.DevKey{Netns: ino, Ifindex: uint32(ifindex)}
	p, err := stage.Start(stage.Options{NetnsNames: []string{dst.Netns}})
	if err != nil {
		t.Fatal(stage.Explain(err))
	}
	defer p.Close()
	const n = 300
	snapshot := func() stage.Snapshot {
		s, err := p.Snapshot()
		if err != nil {
			t.Fatalf("stage probe snapshot: %v", err)
		}
		return s
	}
	backlog := func() uint64 {
		before := snapshot()
		pingPong(t, src.Netns, dst.AddrOnly(), hpPort, n)
		return snapshot().Sub(before).Device(key).RxPackets
	}
	// The probe can count short beside other packages' lab tests (labtest.StageCPUs), so the
	// vanilla floor that shows the probe sees this device's backlog is half of what was sent.
	if got := backlog(); got < n/2 {
		t.Fatalf("vanilla: container eth0's backlog saw %d of %d datagrams; the probe or the path is off", got, n)
	}
	o := datapath.Options{Extra: map[string]string{"rules": hpRules, "agent": "off"}}
	host := l.Hosts[1].Netns
	if _, err := datapath.Attach(context.Background(), host, Name, o); err != nil {
		t.Fatal(err)
	}
	if got := backlog(); got > n/100 {
		t.Fatalf("prism: %d of %d HP datagrams still went through container eth0's backlog", got, n)
	}
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
}
