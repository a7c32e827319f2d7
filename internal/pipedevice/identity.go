package pipedevice

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// identity is who is on the other end of a control connection, taken once when it is accepted
// and kept for its life: nothing is looked up again by PID later (a PID can be reused by another
// process, in another namespace, once the client exits).
type identity struct {
	pid, uid int
	ns       string // "net:[inode]": the namespace's identity, the key of quotas and addresses
	nsfd     int    // an open fd of the namespace: every later look into it goes through this
}

// peerIdentity reads the caller's credentials and opens its network namespace. With a pidfd of
// the connecting process (SO_PEERPIDFD) the namespace is opened under /proc/<pid> and the pidfd
// is checked to be alive afterwards: while that process lives its PID cannot name another one,
// so the namespace is the caller's. Without SO_PEERPIDFD (kernels before 6.5) the same check runs
// on a pidfd opened from SO_PEERCRED's PID, which leaves the window before pidfd_open.
func peerIdentity(c *net.UnixConn) (identity, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return identity{}, err
	}
	var cred *unix.Ucred
	pidfd := -1
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr == nil {
			if p, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
				pidfd = p
			}
		}
	})
	if cerr != nil {
		return identity{}, cerr
	}
	if pidfd < 0 {
		if pidfd, err = unix.PidfdOpen(int(cred.Pid), 0); err != nil {
			return identity{}, fmt.Errorf("pidfd of pid %d: %w", cred.Pid, err)
		}
	}
	defer unix.Close(pidfd)
	pid := int(cred.Pid)
	if p, err := pidfdPid(pidfd); err != nil || p != pid {
		return identity{}, fmt.Errorf("the caller (pid %d) is gone", cred.Pid)
	}
	nsfd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return identity{}, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		unix.Close(nsfd)
		return identity{}, fmt.Errorf("the caller (pid %d) exited while identified", pid)
	}
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		unix.Close(nsfd)
		return identity{}, err
	}
	return identity{pid: pid, uid: int(cred.Uid), ns: fmt.Sprintf("net:[%d]", st.Ino), nsfd: nsfd}, nil
}

// pidfdPid is the PID a pidfd names (its fdinfo's Pid line; -1 once the process exited).
func pidfdPid(pidfd int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", pidfd))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Pid in the pidfd's fdinfo")
}
