package datapath

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// CheckPinFS refuses a pin root outside a bpf filesystem (what `ip netns exec` leaves of
// /sys/fs/bpf) and accepts the real one.
func TestCheckPinFS(t *testing.T) {
	testutil.Set(t, &PinRoot, filepath.Join(t.TempDir(), "peregrine"))
	err := CheckPinFS()
	if err == nil || !strings.Contains(err.Error(), "not a bpf filesystem") || !strings.Contains(err.Error(), "--netns") {
		t.Fatalf("pin root on a temp dir: %v, want a refusal naming the fix", err)
	}
	testutil.RequireBPF(t) // the real /sys/fs/bpf, mounted by setup.sh
	PinRoot = "/sys/fs/bpf/peregrine"
	if err := CheckPinFS(); err != nil {
		t.Fatal(err)
	}
}
