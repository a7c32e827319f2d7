package udpsink

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// recvmmsg waits for at least one datagram (MSG_WAITFORONE), then takes whatever else is queued,
// up to len(msgs). x/sys/unix has no wrapper for it on Linux. MSG_TRUNC makes each msg's Len the
// datagram's real size even if our buffer was shorter.
func recvmmsg(fd int, msgs []unix.Mmsghdr) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])),
		uintptr(len(msgs)), unix.MSG_WAITFORONE|unix.MSG_TRUNC, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func getsockoptRaw(fd, level, opt int, out []uint32) error {
	l := uint32(len(out) * 4)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&out[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
