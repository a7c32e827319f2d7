package inject

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// sndBuf is large so that a full batch never waits for socket memory; with MSG_DONTWAIT a full
// send buffer would otherwise surface as EAGAIN on every batch.
const sndBuf = 4 << 20

// packetSock is a send-only AF_PACKET socket bound to one device of one namespace.
type packetSock struct {
	fd      int
	ifindex int
	mac     MAC
	mtu     int
}

// openPacket opens the socket inside netns. Protocol 0 registers no receive hook, so the socket
// is never handed copies of the device's traffic (which would cost the receiver CPU and memory).
func openPacket(netns, device string, bypass bool) (*packetSock, error) {
	var ps *packetSock
	err := netnsutil.Do(netns, func() error {
		link, err := netlink.LinkByName(device)
		if err != nil {
			return fmt.Errorf("device %q in namespace %q: %w", device, netns, err)
		}
		attrs := link.Attrs()
		if attrs.Flags&(1<<0) == 0 { // net.FlagUp
			return fmt.Errorf("device %q in namespace %q is down", device, netns)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: attrs.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind AF_PACKET to %s (ifindex %d): %w", device, attrs.Index, err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sndBuf); err != nil {
			// Without CAP_NET_ADMIN the plain option still helps, clamped to wmem_max.
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndBuf)
		}
		if bypass {
			if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
				unix.Close(fd)
				return fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
			}
		}
		ps = &packetSock{fd: fd, ifindex: attrs.Index, mtu: attrs.MTU}
		copy(ps.mac[:], attrs.HardwareAddr)
		return nil
	})
	return ps, err
}

func (p *packetSock) Close() error { return unix.Close(p.fd) }

// sendmmsg sends msgs without blocking. x/sys/unix has no wrapper for it on Linux. It returns the
// number of messages the kernel took; a short count means the next message failed (the kernel
// drops that error when some messages went out, so the caller learns it on the next call).
func (p *packetSock) sendmmsg(msgs []unix.Mmsghdr) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(p.fd), uintptr(unsafe.Pointer(&msgs[0])),
		uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// transient reports whether a send error means "the device or its peer is busy right now": the
// frame was refused (veth drops into ENOBUFS when the peer's backlog or ring is full, a stopped
// queue on a no-queue device reads as ENETDOWN, a full send buffer as EAGAIN). Everything else
// (EMSGSIZE, ENXIO when the device went away, EINVAL) is a real error.
func transient(err error) bool {
	return errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.ENETDOWN) ||
		errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EBUSY)
}
