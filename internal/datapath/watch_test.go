package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

func addLink(t *testing.T, ns, name string) {
	t.Helper()
	err := netnsutil.Do(ns, func() error { return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}) })
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The loop syncs after the link changes its Event lets through (debounced: a burst syncs once
// or twice, not once per update), follows a namespace that only appears after the start, and
// ends with ErrNotAttached when Sync reports it.
func TestWatchFollowsLinksAndLateNamespaces(t *testing.T) {
	testutil.RequireRoot(t)
	ns, late := fmt.Sprintf("prg-kitw-%d", os.Getpid()), fmt.Sprintf("prg-kitw-%d-late", os.Getpid())
	if err := netnsutil.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(ns); _ = netnsutil.Delete(late) })
	var syncs atomic.Int32
	var gone atomic.Bool
	var logs testutil.SyncBuffer
	w := Watch{
		Event: func(_ string, u any) bool {
			lu, ok := u.(netlink.LinkUpdate)
			return ok && !strings.HasPrefix(lu.Attrs().Name, "ign")
		},
		Debounce: 50 * time.Millisecond, Every: time.Hour, Log: NewLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		Sync: func(context.Context) error {
			syncs.Add(1)
			if gone.Load() {
				return ErrNotAttached
			}
			return nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background(), []string{ns, late, ns}) }()
	waitFor(t, "the missing namespace to be reported", func() bool { return strings.Contains(logs.String(), "no link events from "+late) })
	time.Sleep(100 * time.Millisecond) // the subscription in ns is up by now
	if n := syncs.Load(); n != 0 {
		t.Fatalf("%d syncs before any event (SyncFirst is off, Every an hour)", n)
	}
	addLink(t, ns, "ign0")
	time.Sleep(200 * time.Millisecond)
	if n := syncs.Load(); n != 0 {
		t.Fatalf("an update Event refused caused %d syncs", n)
	}
	for i := range 5 {
		addLink(t, ns, fmt.Sprintf("kitd%d", i))
	}
	waitFor(t, "a sync after the burst", func() bool { return syncs.Load() > 0 })
	time.Sleep(200 * time.Millisecond)
	if n := syncs.Load(); n > 2 {
		t.Fatalf("a burst of 5 links caused %d syncs, want it debounced", n)
	}
	if err := netnsutil.Create(late); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the late namespace's subscription", func() bool { return strings.Contains(logs.String(), "link events from "+late+" again") })
	before := syncs.Load()
	addLink(t, late, "kitl0")
	waitFor(t, "a sync for the late namespace", func() bool { return syncs.Load() > before })
	gone.Store(true)
	addLink(t, ns, "kitd9")
	select {
	case err := <-done:
		if err != ErrNotAttached {
			t.Fatalf("Run ended with %v, want ErrNotAttached", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end when Sync reported the record gone")
	}
}
