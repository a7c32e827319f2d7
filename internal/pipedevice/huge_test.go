package pipedevice

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
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
