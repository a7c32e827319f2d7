package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/doctor"
)

// TestDoctorCommandFails: a target without an overlay fails the required overlay check, so the
// command returns ErrFailed (exit status 1) after printing every check, as JSON with --json.
func TestDoctorCommandFails(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		c := newDoctorCmd()
		c.SilenceUsage, c.SilenceErrors = true, true // as under the root command
		var out bytes.Buffer
		c.SetOut(&out)
		args := []string{"--netns", "prg-doctor-no-such-namespace"}
		if asJSON {
			args = append(args, "--json")
		}
		c.SetArgs(args)
		err := c.Execute()
		if !errors.Is(err, doctor.ErrFailed) || !strings.Contains(err.Error(), "overlay") {
			t.Fatalf("json=%v: error %v, want ErrFailed naming the overlay", asJSON, err)
		}
		if !asJSON {
			if !strings.Contains(out.String(), "overlay (prg-doctor-no-such-namespace)") || !strings.Contains(out.String(), "FAIL") {
				t.Errorf("table:\n%s", out.String())
			}
			continue
		}
		var checks []doctor.Check
		if err := json.Unmarshal(out.Bytes(), &checks); err != nil {
			t.Fatalf("--json output does not decode: %v\n%s", err, out.String())
		}
		names := map[string]doctor.Status{}
		for _, ch := range checks {
			names[ch.Name] = ch.Status
		}
		if names["overlay"] != doctor.Fail || names["mtu"] != doctor.Skip || names["kernel"] == "" {
			t.Errorf("checks %v", names)
		}
	}
}
