package probe

import (
	"errors"
	"testing"
)

// /proc/softirqs of a 2-CPU 6.18 VM; B is A after some traffic, with CPU1's NET_RX counter
// wrapping past 2^32.
const softirqsA = `                    CPU0       CPU1       
          HI:          0          0
       TIMER:       3650       4176
      NET_TX:          5          0
      NET_RX:       3886 4294967290
       BLOCK:          0      50111
    IRQ_POLL:          0          0
     TASKLET:        376          9
       SCHED:      11318      10801
     HRTIMER:          0          0
         RCU:       8313      10668
`

const softirqsB = `                    CPU0       CPU1       
          HI:          0          0
       TIMER:       3750       4276
      NET_TX:          7          1
      NET_RX:       4886          5
       BLOCK:          0      50111
    IRQ_POLL:          0          0
     TASKLET:        376          9
       SCHED:      11418      10901
     HRTIMER:          0          0
         RCU:       8413      10768
`

func TestParseSoftirqs(t *testing.T) {
	s := mustParse(t, ParseSoftirqs, softirqsA)
	if len(s.CPUs) != 2 || s.CPUs[1] != 1 {
		t.Fatalf("cpus %v", s.CPUs)
	}
	if len(s.Counts) != 10 {
		t.Errorf("%d rows, want 10", len(s.Counts))
	}
	if got := s.Counts["NET_RX"]; got[0] != 3886 || got[1] != 4294967290 {
		t.Errorf("NET_RX %v", got)
	}
	assertParseFails(t, ParseSoftirqs, map[string]string{
		"empty":         "",
		"bad header":    "CPU0 XPU1\nHI: 0 0\n",
		"short row":     "CPU0 CPU1\nHI: 0\n",
		"row without :": "CPU0 CPU1\nHI 0 0\n",
		"bad number":    "CPU0 CPU1\nHI: 0 -1\n",
	})
}

func TestSoftirqDeltas(t *testing.T) {
	d, err := SoftirqDeltas(mustParse(t, ParseSoftirqs, softirqsA), mustParse(t, ParseSoftirqs, softirqsB))
	if err != nil {
		t.Fatal(err)
	}
	// CPU1 NET_RX: 4294967290 -> 5 is one wrap: 6 + 5 = 11.
	if got := d.Counts["NET_RX"]; got[0] != 1000 || got[1] != 11 {
		t.Errorf("NET_RX delta %v, want [1000 11]", got)
	}
	if d.Total["NET_RX"] != 1011 || d.Total["NET_TX"] != 3 || d.Total["TIMER"] != 200 {
		t.Errorf("totals %v", d.Total)
	}
	net := d.Only("NET_RX", "NET_TX", "NOPE")
	if len(net.Counts) != 2 || len(net.Total) != 2 || net.Total["NET_RX"] != 1011 {
		t.Errorf("Only: %+v", net)
	}

	// A CPU column disappearing is refused.
	one := mustParse(t, ParseSoftirqs, "CPU0\nNET_RX: 5\n")
	if _, err := SoftirqDeltas(mustParse(t, ParseSoftirqs, softirqsA), one); !errors.Is(err, ErrCPUSetChanged) {
		t.Errorf("cpu missing: err %v", err)
	}
}

func TestSoftirqsLive(t *testing.T) {
	a, err := ReadSoftirqs()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"NET_RX", "NET_TX", "TIMER"} {
		if _, ok := a.Counts[n]; !ok {
			t.Errorf("no %s row", n)
		}
	}
	b, err := ReadSoftirqs()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SoftirqDeltas(a, b); err != nil {
		t.Error(err)
	}
}
