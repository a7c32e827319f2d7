package lab

import (
	"fmt"
	"os"
	"os/exec"
)

// Preflight checks what building a lab needs and says how to get what is missing.
func Preflight() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("peregrine needs root to create network namespaces: run it with sudo")
	}
	for _, tool := range []struct{ bin, pkg string }{{"ip", "iproute2"}, {"ethtool", "ethtool"}} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			return fmt.Errorf("%s not found: run scripts/setup.sh (or apt-get install %s)", tool.bin, tool.pkg)
		}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("this kernel has no network namespaces (CONFIG_NET_NS): the lab cannot run here")
	}
	return nil
}
