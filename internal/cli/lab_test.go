package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"

	"github.com/peregrine-net/peregrine/internal/lab"
)

// upWithFile parses args of `lab up` against a topology file and returns the spec it would build
// (before Defaults), by running the command's own flags through overrideFileSpec.
func upWithFile(t *testing.T, yaml string, args ...string) lab.Spec {
	t.Helper()
	file := filepath.Join(t.TempDir(), "topo.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var spec lab.Spec
	f := pflag.NewFlagSet("up", pflag.ContinueOnError)
	f.StringVar(&spec.Name, "name", lab.DefaultName, "")
	f.StringVar(&spec.Style, "style", lab.StyleDocker, "")
	f.IntVar(&spec.Hosts, "hosts", 2, "")
	f.IntVar(&spec.MTU, "mtu", 1500, "")
	f.BoolVar(&spec.NAPIThread, "napi-thread", false, "")
	f.BoolVar(&spec.ToR, "tor", false, "")
	if err := f.Parse(args); err != nil {
		t.Fatal(err)
	}
	fromFile, err := lab.LoadSpec(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := overrideFileSpec(f, &spec, fromFile); err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestFlagsWinOverTheFile(t *testing.T) {
	s := upWithFile(t, "name: f\nstyle: flannel\nhosts: 3\nmtu: 9000\n", "--hosts", "4", "--napi-thread", "--tor=false")
	if s.Hosts != 4 || !s.NAPIThread || s.ToR {
		t.Errorf("flags given: hosts %d napi_thread %v tor %v, want 4 true false", s.Hosts, s.NAPIThread, s.ToR)
	}
	if s.Name != "f" || s.Style != lab.StyleFlannel || s.MTU != 9000 {
		t.Errorf("flags not given must keep the file's values: %+v", s)
	}
	// A flag given with its default value still wins over the file.
	if s := upWithFile(t, "tor: true\nmtu: 9000\n", "--mtu", "1500"); s.MTU != 1500 || !s.ToR {
		t.Errorf("mtu %d tor %v, want 1500 true", s.MTU, s.ToR)
	}
}

// TestLabUpFlagsAreScalar guards overrideFileSpec: setting a slice flag again would append.
func TestLabUpFlagsAreScalar(t *testing.T) {
	newLabUpCmd().Flags().VisitAll(func(fl *pflag.Flag) {
		if _, ok := fl.Value.(pflag.SliceValue); ok {
			t.Errorf("--%s is slice-valued: overrideFileSpec would append to it", fl.Name)
		}
	})
}
