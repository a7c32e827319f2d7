package datapath

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CheckPinFS says why peregrine's pins cannot be made or read here: the directory holding
// PinRoot must be a bpf filesystem. The usual way to get this wrong is `ip netns exec NS
// peregrine ...`: ip mounts a fresh sysfs on /sys for the command, /sys/fs/bpf becomes a plain
// sysfs directory, every pin is out of sight, and without this check status would call each
// knob changed, and attach and detach could not reach the pins they make and remove.
func CheckPinFS() error {
	dir := filepath.Dir(PinRoot)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%s: %w (mount the bpf filesystem there: mount -t bpf bpf %s)", dir, err, dir)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not a bpf filesystem here, so peregrine's pins are out of sight: run peregrine from the host's mount namespace and name the network namespace with --netns (`ip netns exec` mounts its own /sys and hides /sys/fs/bpf); if bpffs is not mounted at all: mount -t bpf bpf %s", dir, dir)
	}
	return nil
}
