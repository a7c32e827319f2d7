package pipedevice

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
	"golang.org/x/sys/unix"
)

// Rings are 2 MiB hugepages when some are reserved, normal pages otherwise, and status says so.
// The test reserves a few hugepages (vm.nr_hugepages) for its duration.
func TestHugepageRings(t *testing.T) {
	testutil.RequireRoot(t)
	want := reserveHugepages(t, 4)
	d := startDaemon(t, Config{Ring: 2 << 20, Pool: 1 << 20})
	a, b2 := dial(t, d), dial(t, d)
	cs, ss := pair(t, a, b2, 7870)
	st := d.Status()
	if st.RingsHuge < 1 {
		t.Fatalf("with hugepages reserved no ring got one: %+v", st)
	}
	if !strings.Contains(st.Hugepages, "nr_hugepages="+strconv.Itoa(want)) {
		t.Fatalf("status says %q", st.Hugepages)
	}
	transfer(t, a, b2, cs, ss, 8<<20, 65536)

	// a ring size that is not a whole number of hugepages falls back to normal pages
	d2 := startDaemon(t, Config{Ring: 1 << 20})
	c := dial(t, d2)
	mustSocket(t, c)
	if st := d2.Status(); st.RingsHuge != 0 || st.RingsNormal != 1 {
		t.Fatalf("a 1 MiB ring: %d huge, %d normal", st.RingsHuge, st.RingsNormal)
	}
}

// reserveHugepages reserves n more 2 MiB hugepages for the test's duration and returns the new
// vm.nr_hugepages.
func reserveHugepages(t *testing.T, n int) int {
	t.Helper()
	const knob = "/proc/sys/vm/nr_hugepages"
	b, err := os.ReadFile(knob)
	if err != nil {
		t.Fatalf("hugepages: %v", err)
	}
	old, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	want := old + n
	if err := os.WriteFile(knob, []byte(strconv.Itoa(want)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(knob, []byte(strconv.Itoa(old)), 0o644) })
	if b, _ := os.ReadFile(knob); strings.TrimSpace(string(b)) != strconv.Itoa(want) {
		t.Fatalf("the kernel reserved %s hugepages of %d asked (memory too fragmented?)", strings.TrimSpace(string(b)), want)
	}
	return want
}

// Issue 21's crash, step by step: a client punches its hugepage pool before the seal and the
// freed hugepage goes to others, so none is left to fill the hole. The seal's populate finds
// that out (instead of a SIGBUS in the engine later): the client is refused and never served,
// and everyone else goes on.
func TestPunchedHugepagePoolRefused(t *testing.T) {
	testutil.RequireRoot(t)
	reserveHugepages(t, 3)
	d := startDaemon(t, Config{Ring: 64 << 10, Pool: 2 << 20})
	raw := rawConn(t, d)
	rc := &Client{conn: raw, connFD: -1}
	h, err := rc.call(Request{Op: OpHello})
	if err != nil || len(h.FDs) != 5 || h.V[4] != 1 {
		t.Fatalf("hello: %v, %d fds, pool on hugepages %v", err, len(h.FDs), h.V[4] == 1)
	}
	defer closeFDs(h.FDs)
	if err := unix.Fallocate(h.FDs[1], unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(h.W[1])); err != nil {
		t.Fatalf("punch before the seal: %v", err)
	}
	var others []*Client
	for i := 0; i < 3; i++ { // the freed hugepage and the two others go to honest clients
		c := dial(t, d)
		if !c.PoolHuge {
			t.Fatalf("client %d got no hugepage", i)
		}
		others = append(others, c)
	}
	for try := 0; try < 2; try++ { // asking again changes nothing
		if _, err := rc.call(Request{Op: OpSeal}); !errors.Is(err, unix.ENOMEM) {
			t.Fatalf("seal with a hole and no hugepage to fill it (try %d): %v, want ENOMEM", try, err)
		}
	}
	if _, err := rc.call(Request{Op: OpSocket}); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("a socket for the refused client: %v, want ENOTCONN", err)
	}
	cs, ss := pair(t, others[0], others[1], 7875)
	transfer(t, others[0], others[1], cs, ss, 8<<20, 65536)
}
