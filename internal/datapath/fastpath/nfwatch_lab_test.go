package fastpath

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

func TestNfChange(t *testing.T) {
	nft := func(msg uint16) uint16 { return unix.NFNL_SUBSYS_NFTABLES<<8 | msg }
	for _, c := range []struct {
		typ  uint16
		want bool
	}{
		{nft(unix.NFT_MSG_NEWRULE), true},
		{nft(unix.NFT_MSG_DELRULE), true},
		{nft(unix.NFT_MSG_NEWCHAIN), true},
		{nft(unix.NFT_MSG_DELTABLE), true},
		{nft(unix.NFT_MSG_NEWSETELEM), true},
		{nft(unix.NFT_MSG_DELSETELEM), true},
		{nft(unix.NFT_MSG_NEWGEN), false}, // closes every transaction, changes or not
		{nft(unix.NFT_MSG_TRACE), false},
		{unix.NFNL_SUBSYS_CTNETLINK<<8 | 0, false}, // a conntrack message is no rule change
		{unix.NLMSG_ERROR, false},
	} {
		if got := nfChange(c.typ); got != c.want {
			t.Errorf("nfChange(%#x) = %v, want %v", c.typ, got, c.want)
		}
	}
}

// TestLegacyTables checks the iptables-legacy detection: a fresh namespace has no legacy
// tables, one where iptables-legacy listed its filter table (which registers it) has.
func TestLegacyTables(t *testing.T) {
	const ns = "prg-nflegacy"
	testutil.TempNetns(t, ns)
	if got := legacyTables(ns); len(got) != 0 {
		t.Fatalf("fresh namespace: legacy tables %v, want none", got)
	}
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("no iptables-legacy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := netnsutil.Run(ctx, ns, "iptables-legacy", "-L", "FORWARD"); err != nil {
		t.Fatalf("iptables-legacy: %v: %s", err, out)
	}
	if got := legacyTables(ns); !slices.Contains(got, "filter") {
		t.Fatalf("after iptables-legacy -L: legacy tables %v, want filter", got)
	}
}

// TestLabNetfilterChange checks issue 23's property: a DROP added to FORWARD on the receiving
// host stops an established fast-path flow within 1 s (the fast path's redirect skips FORWARD;
// without the agent's netfilter watch the flow went on until its 5 s re-learn), and once the
// rule is gone new connections work again.
func TestLabNetfilterChange(t *testing.T) {
	const port = 5411
	l := labForTest(t, lab.Spec{Name: "fpnf", Style: lab.StyleFlannel, Containers: 2})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c11, c21 := l.Containers[0], l.Containers[2]
	dst := net.JoinHostPort(c21.AddrOnly(), fmt.Sprint(port))
	attachAll(t, hosts)

	labtest.EchoTCP(t, c21.Netns, dst)
	dial := func() (net.Conn, error) {
		return netnsutil.DialContext(context.Background(), c11.Netns, &net.Dialer{Timeout: 2 * time.Second}, "tcp4", dst)
	}
	echo := func(c net.Conn, timeout time.Duration) error {
		buf := make([]byte, 64)
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	}

	// A 64 B ping-pong, a round every millisecond; lastOK is when the last round completed.
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var lastOK atomic.Int64
	var rounds atomic.Int64
	go func() {
		for {
			// 3 s: longer than the 1 s bound, so a stall shows as a late success, not an error.
			if echo(c, 3*time.Second) != nil {
				return // the DROP's timeout, or the cleanup's Close
			}
			lastOK.Store(time.Now().UnixNano())
			rounds.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	hit := func() uint64 { _, in := hits(t, hosts[1]); return in }
	var from uint64
	labtest.Eventually(t, 3*time.Second, "the ping-pong on the fast path into h2", func() (bool, string) {
		h := hit()
		ok := from > 0 && h >= from+50
		if from == 0 {
			from = h
		}
		return ok, fmt.Sprintf("h2 ingress hits %d (from %d), %d rounds", h, from, rounds.Load())
	})

	rule := []string{"-p", "tcp", "--dport", fmt.Sprint(port), "-j", "DROP"}
	ipt := func(op string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := netnsutil.Run(ctx, hosts[1], append([]string{"iptables-nft", op, "FORWARD"}, rule...)...)
		if err != nil {
			return fmt.Errorf("iptables-nft %s: %v: %s", op, err, out)
		}
		return nil
	}
	t.Cleanup(func() { _ = ipt("-D") }) // also when a check below fails
	before := rounds.Load()
	if err := ipt("-I"); err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	// Wait past the bound (and well short of the 5 s re-learn), then check that nothing has
	// completed since the bound.
	time.Sleep(1500 * time.Millisecond)
	last := time.Unix(0, lastOK.Load())
	stop := last.Sub(added)
	t.Logf("DROP added: the last echo completed %v after `iptables-nft -I` returned (%d rounds after it)",
		stop.Round(time.Millisecond), rounds.Load()-before)
	if stop > time.Second {
		t.Fatalf("the established flow went on for %v after the DROP (want <= 1s)", stop)
	}
	if rounds.Load() == before && stop < -100*time.Millisecond {
		t.Fatalf("the ping-pong had stopped before the rule: nothing measured")
	}

	if err := ipt("-D"); err != nil {
		t.Fatal(err)
	}
	c2, err := dial()
	if err != nil {
		t.Fatalf("a new connection after the DROP was removed: %v", err)
	}
	defer c2.Close()
	for i := range 20 {
		if err := echo(c2, 2*time.Second); err != nil {
			t.Fatalf("echo %d on a new connection after the DROP was removed: %v", i, err)
		}
	}
}
