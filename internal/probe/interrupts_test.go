package probe

import (
	"errors"
	"strings"
	"testing"
)

// /proc/interrupts of the 2-CPU 6.18 lab VM (trimmed); B is A after some traffic: RPS kicks
// (CAL), wakeups (RES), the virtio NIC's rx IRQ, CPU1's CAL counter wrapping past 2^32.
const interruptsA = `           CPU0       CPU1       
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 41:       2121          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx
 42:          0       4204 PCI-MSIX-0000:00:04.0   2-edge      virtio3-tx
NMI:          0          0   Non-maskable interrupts
LOC:    1880190    3762405   Local timer interrupts
IWI:         31         67   IRQ work interrupts
RES:     104878    1547063   Rescheduling interrupts
CAL:   15823200 4294967290   Function call interrupts
TLB:      84900      70401   TLB shootdowns
ERR:          0
MIS:          0
PIN:          0          0   Posted-interrupt notification event
`

// interruptsB changes only the rows that moved, so the fixture says what the deltas must find.
var interruptsB = strings.NewReplacer(
	" 41:       2121", " 41:       2131",
	"LOC:    1880190    3762405", "LOC:    1880290    3762505",
	"IWI:         31", "IWI:         32",
	"RES:     104878    1547063", "RES:     104978    1547163",
	"CAL:   15823200 4294967290", "CAL:   15824200          4",
	"TLB:      84900", "TLB:      84901",
	"ERR:          0", "ERR:          3",
).Replace(interruptsA)

func TestParseInterrupts(t *testing.T) {
	in := mustParse(t, ParseInterrupts, interruptsA)
	if len(in.CPUs) != 2 || in.CPUs[1] != 1 {
		t.Fatalf("cpus %v", in.CPUs)
	}
	if got := in.Rows["CAL"]; len(got) != 2 || got[0] != 15823200 {
		t.Fatalf("CAL row %v", got)
	}
	if _, ok := in.Rows["ERR"]; ok {
		t.Fatal("ERR has no per-CPU counts and must be left out")
	}
	if in.Desc["41"] != "PCI-MSIX-0000:00:04.0 1-edge virtio3-rx" {
		t.Fatalf("description of 41: %q", in.Desc["41"])
	}
	for label, want := range map[string]string{"41": IRQKindDevice, "LOC": IRQKindLOC, "RES": IRQKindRES,
		"CAL": IRQKindCAL, "TLB": IRQKindTLB, "IWI": IRQKindOther, "NMI": IRQKindOther} {
		if got := IRQKind(label, in.Desc[label]); got != want {
			t.Errorf("kind of %s = %s, want %s", label, got, want)
		}
	}
	// arm64 names its IPIs IPIn and says what they are in the description.
	if IRQKind("IPI0", "Rescheduling interrupts") != IRQKindRES || IRQKind("IPI1", "Function call interrupts") != IRQKindCAL {
		t.Error("arm64 IPI rows should be classified by their description")
	}
	assertParseFails(t, ParseInterrupts, map[string]string{
		"empty":         "",
		"bad header":    "CPU0 CPUx\n",
		"row without :": "CPU0\nLOC 5\n",
		"no counts":     "CPU0\nLOC: x\n",
	})
}

func TestInterruptDeltas(t *testing.T) {
	d, err := InterruptDeltas(mustParse(t, ParseInterrupts, interruptsA), mustParse(t, ParseInterrupts, interruptsB))
	if err != nil {
		t.Fatal(err)
	}
	// CAL: 1000 on CPU0, and CPU1 wrapped: 4294967290 -> 4 is 10.
	if cal := d.ByKind[IRQKindCAL]; cal[0] != 1000 || cal[1] != 10 {
		t.Fatalf("CAL per CPU %v, want [1000 10]", cal)
	}
	if d.Kind(IRQKindRES) != 200 || d.Kind(IRQKindLOC) != 200 || d.Kind(IRQKindDevice) != 10 || d.Kind(IRQKindTLB) != 1 || d.Kind(IRQKindOther) != 1 {
		t.Fatalf("kinds %v", d.ByKind)
	}
	if d.Total != 1010+200+200+10+1+1 {
		t.Fatalf("total %d", d.Total)
	}
	if len(d.Devices) != 1 || d.Devices["41 virtio3-rx"] != 10 {
		t.Fatalf("devices %v, want only 41 virtio3-rx: 10", d.Devices)
	}
	other := mustParse(t, ParseInterrupts, "           CPU0\nLOC: 5 Local timer interrupts\n")
	if _, err := InterruptDeltas(mustParse(t, ParseInterrupts, interruptsA), other); !errors.Is(err, ErrCPUSetChanged) {
		t.Fatalf("different CPU sets: %v", err)
	}
}

func TestReadInterruptsLive(t *testing.T) {
	a, err := ReadInterrupts()
	if err != nil {
		t.Skipf("no /proc/interrupts here: %v", err)
	}
	if len(a.Rows) == 0 {
		t.Fatal("live /proc/interrupts parsed to no rows")
	}
	b, err := ReadInterrupts()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InterruptDeltas(a, b); err != nil {
		t.Fatalf("delta of two live reads: %v", err)
	}
}
