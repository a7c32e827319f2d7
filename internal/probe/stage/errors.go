package stage

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// tracepoints the probe attaches to, as BTF names them (the kernel's btf_trace_<name> typedefs).
var tracepoints = []string{"netif_receive_skb", "netif_rx", "napi_poll", "softirq_entry", "softirq_exit"}

// ErrNoBTF means the kernel has no BTF, which BTF tracepoints and CO-RE both need.
var ErrNoBTF = errors.New("kernel lacks BTF (/sys/kernel/btf/vmlinux; build it with CONFIG_DEBUG_INFO_BTF=y)")

// Check tells whether this kernel can run the probe, without loading anything. The programs
// attach as BTF tracepoints (tp_btf), so they need kernel BTF but not tracefs.
func Check() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("%w: %v", ErrNoBTF, err)
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoBTF, err)
	}
	var missing []string
	for _, tp := range tracepoints {
		if _, err := spec.AnyTypeByName("btf_trace_" + tp); err != nil {
			missing = append(missing, tp)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("kernel lacks tracepoints %v (CONFIG_TRACEPOINTS, CONFIG_NET)", missing)
	}
	return nil
}

// Explain adds the likely cause to an error from loading or attaching the probe.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	if cerr := Check(); cerr != nil {
		return fmt.Errorf("%w (%v)", err, cerr)
	}
	var verr *ebpf.VerifierError
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w (run as root, or with CAP_BPF and CAP_PERFMON)", err)
	case errors.As(err, &verr):
		// The last lines of the log say why; %+v prints the whole log for a bug report.
		return fmt.Errorf("%w (verifier rejected the program; its log: %+v)", err, verr)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%w (kernel too old for BTF tracepoints: needs Linux 5.5 or newer)", err)
	}
	return err
}
