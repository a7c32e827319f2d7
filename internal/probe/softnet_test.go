package probe

import (
	"errors"
	"strings"
	"testing"
)

// 15 columns, as Linux 6.18 prints: ... received_rps flow_limit backlog_len cpu input_qlen process_qlen.
const softnet15A = `0000000e 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0000153b 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000
`

const softnet15B = `0001000e 00000002 00000003 00000000 00000000 00000000 00000000 00000000 00000000 00000010 00000000 00000005 00000000 00000002 00000003
0000253b 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000004 00000000 00000001 00000000 00000000
`

// 13 columns (5.10 to early 6.x): the CPU index is the last column. CPU 1 is offline, so the
// rows are CPUs 0 and 2 and the second row's CPU id is not its row number.
const softnet13A = `fffffff0 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000000
00001000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000007 00000000 00000009 00000002
`

const softnet13B = `00000010 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000000
00002000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000008 00000000 00000001 00000002
`

// 11 columns (3.11 to 5.9): no backlog length, no CPU index.
const softnet11 = `0a1b2c3d 00000005 0000002a 00000000 00000000 00000000 00000000 00000000 00000000 00000064 00000001
00fedcba 00000000 00000003 00000000 00000000 00000000 00000000 00000000 00000000 000000c8 00000000
`

func TestParseSoftnetLayouts(t *testing.T) {
	s := mustParse(t, ParseSoftnet, softnet15B)
	if s.Columns != 15 || !s.CPUIndexed {
		t.Fatalf("15-col: columns %d indexed %v", s.Columns, s.CPUIndexed)
	}
	want0 := SoftnetCPU{CPU: 0, SoftnetCounters: SoftnetCounters{Processed: 0x1000e, Dropped: 2, TimeSqueeze: 3,
		ReceivedRPS: 0x10, BacklogLen: 5, InputQLen: 2, ProcessQLen: 3}}
	if s.PerCPU[0] != want0 {
		t.Errorf("15-col cpu0 = %+v, want %+v", s.PerCPU[0], want0)
	}
	if s.PerCPU[1].CPU != 1 || s.PerCPU[1].FlowLimitCount != 4 {
		t.Errorf("15-col cpu1 = %+v", s.PerCPU[1])
	}

	s = mustParse(t, ParseSoftnet, softnet13A)
	if s.Columns != 13 || !s.CPUIndexed {
		t.Fatalf("13-col: columns %d indexed %v", s.Columns, s.CPUIndexed)
	}
	if ids := s.CPUs(); ids[0] != 0 || ids[1] != 2 {
		t.Errorf("13-col cpu ids %v, want [0 2] from the cpu column", ids)
	}
	if s.PerCPU[1].BacklogLen != 9 || s.PerCPU[1].ReceivedRPS != 7 {
		t.Errorf("13-col cpu2 = %+v", s.PerCPU[1])
	}

	s = mustParse(t, ParseSoftnet, softnet11)
	if s.Columns != 11 || s.CPUIndexed {
		t.Fatalf("11-col: columns %d indexed %v", s.Columns, s.CPUIndexed)
	}
	want1 := SoftnetCPU{CPU: 1, SoftnetCounters: SoftnetCounters{Processed: 0xfedcba, TimeSqueeze: 3, ReceivedRPS: 200}}
	if s.PerCPU[1] != want1 {
		t.Errorf("11-col row 1 = %+v, want %+v", s.PerCPU[1], want1)
	}
	if s.PerCPU[0].FlowLimitCount != 1 || s.PerCPU[0].Dropped != 5 || s.PerCPU[0].TimeSqueeze != 42 {
		t.Errorf("11-col row 0 = %+v", s.PerCPU[0])
	}
}

func TestParseSoftnetErrors(t *testing.T) {
	assertParseFails(t, ParseSoftnet, map[string]string{
		"empty":          "",
		"too few cols":   "00000001 00000000 00000000\n",
		"ragged rows":    softnet11 + "00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n",
		"not hex":        strings.Replace(softnet11, "0a1b2c3d", "0a1b2c3z", 1),
		"duplicate cpus": softnet13A + strings.SplitAfter(softnet13A, "\n")[1],
	})
}

func TestSoftnetDeltas(t *testing.T) {
	d, err := SoftnetDeltas(mustParse(t, ParseSoftnet, softnet15A), mustParse(t, ParseSoftnet, softnet15B))
	if err != nil {
		t.Fatal(err)
	}
	if d.PerCPU[0].Processed != 0x10000 || d.PerCPU[0].Dropped != 2 || d.PerCPU[0].TimeSqueeze != 3 || d.PerCPU[0].ReceivedRPS != 16 {
		t.Errorf("cpu0 delta %+v", d.PerCPU[0])
	}
	if d.PerCPU[0].BacklogLen != 5 {
		t.Errorf("backlog_len is a gauge: want the end value 5, got %d", d.PerCPU[0].BacklogLen)
	}
	if d.Total.Processed != 0x10000+0x1000 || d.Total.FlowLimitCount != 4 || d.Total.TimeSqueeze != 4 {
		t.Errorf("total %+v", d.Total)
	}

	// 13-col: CPU0 processed wraps from 0xfffffff0 to 0x10 = 0x20 packets.
	d, err = SoftnetDeltas(mustParse(t, ParseSoftnet, softnet13A), mustParse(t, ParseSoftnet, softnet13B))
	if err != nil {
		t.Fatal(err)
	}
	if d.PerCPU[0].Processed != 0x20 || d.PerCPU[1].CPU != 2 || d.PerCPU[1].Processed != 0x1000 || d.PerCPU[1].ReceivedRPS != 1 {
		t.Errorf("13-col delta %+v", d.PerCPU)
	}

	// Layout change and CPU set change are errors.
	if _, err := SoftnetDeltas(mustParse(t, ParseSoftnet, softnet11), mustParse(t, ParseSoftnet, softnet13A)); err == nil {
		t.Error("layout change: no error")
	}
	if _, err := SoftnetDeltas(mustParse(t, ParseSoftnet, softnet15A), mustParse(t, ParseSoftnet, softnet13A)); err == nil {
		t.Error("15 -> 13 columns: no error")
	}
	b := mustParse(t, ParseSoftnet, softnet15B)
	b.PerCPU = b.PerCPU[1:]
	if _, err := SoftnetDeltas(mustParse(t, ParseSoftnet, softnet15A), b); !errors.Is(err, ErrCPUSetChanged) {
		t.Errorf("cpu missing: err %v", err)
	}
}

func TestSoftnetLive(t *testing.T) {
	s, err := ReadSoftnet()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("softnet_stat: %d columns, %d CPUs, indexed %v", s.Columns, len(s.PerCPU), s.CPUIndexed)
	c, err := ReadCPUStat()
	if err != nil {
		t.Fatal(err)
	}
	// Both files list the online CPUs; with a CPU column the ids must agree.
	if s.CPUIndexed && !sameCPUs(s.CPUs(), c.CPUs()) {
		t.Errorf("softnet CPUs %v, /proc/stat CPUs %v", s.CPUs(), c.CPUs())
	}
}

func TestDelta32(t *testing.T) {
	for _, c := range []struct {
		prev, cur, want uint64
		err             bool
	}{
		{5, 9, 4, false},
		{0xffffffff, 0, 1, false},
		{0xfffffff0, 0x10, 0x20, false},
		{1 << 33, 5, 0, true}, // wider than 32 bits and going back: a reset, not a wrap
	} {
		got, err := delta32(c.prev, c.cur)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("delta32(%#x, %#x) = %#x, %v; want %#x, err %v", c.prev, c.cur, got, err, c.want, c.err)
		}
	}
}
