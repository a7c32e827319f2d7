package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/doctor"
)

// newDoctorCmd checks what the node needs for peregrine and what it has.
func newDoctorCmd() *cobra.Command {
	var t targetFlags
	var underlay string
	var asJSON bool
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check what this node needs for peregrine and what it has, and what to do about each gap",
		Long: `doctor checks the kernel and its eBPF features (tcx, bpf_redirect_peer, BTF), the bpf and
trace filesystems, the process's privileges, the overlay discovery finds and the settings along
its path known to break or slow it: MTUs (VXLAN + encapsulation vs the underlay, pods vs the
VXLAN device), transmit checksum offload on VXLAN devices (6.12+ kernels) and BIG TCP.

Each check is ok, warn (works, known to hurt), fail (required: the exit status is 1) or skip
(depends on one that failed), with what to do. It changes nothing on the node; the feature
probes load a trivial BPF program and attach it to no device.`,
		Example: `  sudo peregrine doctor
  sudo peregrine doctor --netns prg-lab-h1 --json
  sudo peregrine doctor --lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			nss, _, err := t.resolve()
			if err != nil {
				return err
			}
			checks := doctor.NodeChecks()
			for _, ns := range nss {
				checks = append(checks, doctor.OverlayChecks(doctor.Target{Netns: ns, Underlay: underlay})...)
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), checks); err != nil {
					return err
				}
			} else if err := doctor.Write(cmd.OutOrStdout(), checks); err != nil {
				return err
			}
			if err := doctor.Required(checks); err != nil {
				return fmt.Errorf("%w: %v", doctor.ErrFailed, err)
			}
			return nil
		},
	}
	t.add(c)
	c.Flags().StringVar(&underlay, "underlay", "", "the underlay device, when discovery cannot tell it")
	c.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	return c
}
