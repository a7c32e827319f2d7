package fastpath

import (
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// big_tcp takes 0 (off) or a size above 64 KiB; anything else is refused before anything is
// read or changed, and a device that is missing is named.
func TestBigTCPKnobsRefuse(t *testing.T) {
	topo := &datapath.Topology{Devs: []datapath.Dev{{Name: "prg-no-such-dev", Stage: datapath.StageNIC}}}
	if ks, err := bigTCPKnobs(topo, 0); err != nil || ks != nil {
		t.Fatalf("off: %v %v", ks, err)
	}
	for _, n := range []int{1, 65536} {
		if _, err := bigTCPKnobs(topo, n); err == nil || !strings.Contains(err.Error(), "above 64 KiB") {
			t.Errorf("size %d: %v", n, err)
		}
	}
	if _, err := bigTCPKnobs(topo, 185000); err == nil || !strings.Contains(err.Error(), "prg-no-such-dev") {
		t.Errorf("missing device: %v", err)
	}
}

// On a device that allows it (loopback: tso_max_size 524280 on kernels with IPv4 BIG TCP),
// every size attribute gets a knob (once per device); gso sizes never exceed tso_max_size;
// devices of other stages are left alone; the underlay keeps its GRO sizes.
func TestBigTCPKnobsLoopback(t *testing.T) {
	tso, err := tsoMax("", "lo")
	if err != nil || tso <= bigTCPMin {
		t.Skipf("loopback cannot carry BIG TCP here (tso_max_size %d, %v)", tso, err)
	}
	topo := &datapath.Topology{Devs: []datapath.Dev{{Name: "lo", Stage: datapath.StageVXLAN}, {Name: "lo", Stage: datapath.StageVethHost}, {Name: "x", Stage: "other"}}}
	ks, err := bigTCPKnobs(topo, 600000)
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != len(bigTCPAttrs) {
		t.Fatalf("knobs %+v", ks)
	}
	for _, k := range ks {
		gso := strings.Contains(k.Path, "gso")
		if (gso && k.New != "524280" && k.New != strconv.Itoa(int(tso))) || (!gso && k.New != "600000") || !strings.HasPrefix(k.Path, "link:lo/") {
			t.Errorf("knob %+v (tso_max_size %d)", k, tso)
		}
	}
}

func TestBigTCPKnobsUnderlayKeepsGRO(t *testing.T) {
	if tso, err := tsoMax("", "lo"); err != nil || tso <= bigTCPMin {
		t.Skipf("loopback cannot carry BIG TCP here (tso_max_size %d, %v)", tso, err)
	}
	ks, err := bigTCPKnobs(&datapath.Topology{Devs: []datapath.Dev{{Name: "lo", Stage: datapath.StageNIC}}}, 200000)
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 2 || !strings.Contains(ks[0].Path, "gso") || !strings.Contains(ks[1].Path, "gso") {
		t.Errorf("underlay knobs %+v", ks)
	}
}
