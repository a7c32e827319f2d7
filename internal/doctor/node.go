package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Version is a kernel version from the release string (uname -r).
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// ParseRelease reads the version at the start of a kernel release string: "6.18.44-fc-v782",
// "5.14.0-362.el9.x86_64", "6.1". The patch level may be missing; major and minor may not.
func ParseRelease(rel string) (Version, error) {
	end := strings.IndexFunc(rel, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	head := rel
	if end >= 0 {
		head = rel[:end]
	}
	parts := strings.Split(strings.TrimSuffix(head, "."), ".")
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("kernel release %q does not start with major.minor", rel)
	}
	var n [3]int
	for i := 0; i < len(parts) && i < 3; i++ {
		x, err := strconv.Atoi(parts[i])
		if err != nil || x < 0 || x > 1<<20 {
			return Version{}, fmt.Errorf("kernel release %q: bad number %q", rel, parts[i])
		}
		n[i] = x
	}
	return Version{n[0], n[1], n[2]}, nil
}

// kernelRelease is uname -r.
func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

func kernelVersion() (Version, error) {
	rel, err := kernelRelease()
	if err != nil {
		return Version{}, err
	}
	return ParseRelease(rel)
}

// NodeChecks are the checks that do not depend on the overlay: kernel, privileges, filesystems
// and eBPF features. The feature probes load a trivial program; they change nothing else.
func NodeChecks() []Check {
	checks := []Check{kernelCheck(), privilegesCheck(), bpffsCheck(), btfCheck(), tracefsCheck()}
	// Before 5.11 maps and programs are charged to memlock; a failure shows in the probes.
	_ = rlimit.RemoveMemlock()
	return append(checks, tcxCheck(), redirectPeerCheck())
}

func kernelCheck() Check {
	c := Check{Name: "kernel"}
	rel, err := kernelRelease()
	if err != nil {
		c.Status, c.Detail = Fail, "uname: "+err.Error()
		return c
	}
	v, err := ParseRelease(rel)
	if err != nil {
		c.Status, c.Detail = Warn, err.Error()
		c.Fix = "the feature checks below decide what this kernel can do"
		return c
	}
	c.Detail = rel
	if v.AtLeast(6, 6) {
		c.Status = OK
		return c
	}
	c.Status = Warn
	c.Detail += " (before 6.6, the first with tcx)"
	c.Fix = "peregrine attaches its programs with tcx: use a 6.6 or later kernel unless the tcx check below passes (a backport)"
	return c
}

// Capability numbers (linux/capability.h).
const (
	capNetAdmin    = 12
	capSysChroot   = 18
	capSysAdmin    = 21
	capSysResource = 24
	capPerfmon     = 38
	capBPF         = 39
)

// ParseCapEff reads the effective capability set from /proc/PID/status text.
func ParseCapEff(status string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff line")
}

// capVerdict judges an effective set. bpf(2) and perf events accept CAP_SYS_ADMIN in place of
// CAP_BPF and CAP_PERFMON; netlink changes need CAP_NET_ADMIN; setns into another network
// namespace needs CAP_SYS_ADMIN, and into a mount namespace (back out of the private one in
// which a pod namespace's sysfs is mounted) CAP_SYS_CHROOT as well.
func capVerdict(eff uint64, k Version) (Status, string, string) {
	has := func(c int) bool { return eff&(1<<c) != 0 }
	order := []int{capNetAdmin, capSysAdmin, capSysChroot, capBPF, capPerfmon, capSysResource}
	names := map[int]string{capNetAdmin: "NET_ADMIN", capSysAdmin: "SYS_ADMIN", capSysChroot: "SYS_CHROOT", capBPF: "BPF", capPerfmon: "PERFMON", capSysResource: "SYS_RESOURCE"}
	var have, missing []string
	for _, c := range order {
		if has(c) {
			have = append(have, names[c])
		} else {
			missing = append(missing, names[c])
		}
	}
	detail := "effective: " + strings.Join(have, " ")
	if len(have) == 0 {
		detail = "effective: none of NET_ADMIN SYS_ADMIN SYS_CHROOT BPF PERFMON SYS_RESOURCE"
	}
	// SYS_RESOURCE matters only where BPF maps are charged to memlock (before 5.11): the
	// shipped DaemonSet does not grant it, and the fix asks for it only there.
	fix := "run as root, or grant CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and CAP_SYS_CHROOT (deploy/kubernetes/daemonset.yaml)"
	switch {
	case !has(capNetAdmin) || !has(capSysAdmin) || !has(capSysChroot):
		return Fail, detail + "; missing " + strings.Join(missing, " "), fix
	case !k.AtLeast(5, 11) && !has(capSysResource):
		return Warn, detail + "; kernels before 5.11 charge BPF maps to memlock, which needs SYS_RESOURCE to raise",
			"grant CAP_SYS_RESOURCE too (add it to the DaemonSet's capabilities), or run a kernel of 5.11 or later"
	}
	return OK, detail, ""
}

func privilegesCheck() Check {
	c := Check{Name: "privileges"}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		c.Status, c.Detail = Fail, err.Error()
		return c
	}
	eff, err := ParseCapEff(string(b))
	if err != nil {
		c.Status, c.Detail = Fail, "/proc/self/status: "+err.Error()
		return c
	}
	k, _ := kernelVersion()
	c.Status, c.Detail, c.Fix = capVerdict(eff, k)
	if os.Geteuid() != 0 && c.Status == OK {
		c.Status = Warn
		c.Detail += fmt.Sprintf("; uid %d: sysfs knobs, pins and records are root's", os.Geteuid())
		c.Fix = "run as root (uid 0) with the capabilities above"
	}
	return c
}

// fsIs reports whether path is the root of a mount of the given filesystem type.
func fsIs(path string, magic int64) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return int64(st.Type) == magic, nil
}

func bpffsCheck() Check {
	c := Check{Name: "bpffs"}
	ok, err := fsIs("/sys/fs/bpf", unix.BPF_FS_MAGIC)
	switch {
	case err != nil:
		c.Status, c.Detail = Fail, "/sys/fs/bpf: "+err.Error()
	case !ok:
		c.Status, c.Detail = Fail, "/sys/fs/bpf is not a bpf filesystem"
	default:
		c.Status, c.Detail = OK, "/sys/fs/bpf is mounted"
		return c
	}
	c.Fix = "mount -t bpf bpf /sys/fs/bpf (systemd does at boot); in a container, mount the host's /sys/fs/bpf: pins there are what outlives the agent"
	return c
}

func btfCheck() Check {
	c := Check{Name: "btf"}
	f, err := os.Open("/sys/kernel/btf/vmlinux")
	if err == nil {
		var magic [2]byte
		_, err = f.Read(magic[:])
		f.Close()
		if err == nil && magic != [2]byte{0x9f, 0xeb} && magic != [2]byte{0xeb, 0x9f} {
			err = fmt.Errorf("not BTF (magic %x)", magic)
		}
	}
	if err != nil {
		c.Status, c.Detail = Fail, "/sys/kernel/btf/vmlinux: "+err.Error()
		c.Fix = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y: peregrine's programs are CO-RE and are relocated against the kernel's BTF"
		return c
	}
	c.Status, c.Detail = OK, "/sys/kernel/btf/vmlinux"
	return c
}

const tracefsMagic = 0x74726163 // TRACEFS_MAGIC

func tracefsCheck() Check {
	c := Check{Name: "tracefs"}
	for _, p := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if ok, _ := fsIs(p, tracefsMagic); ok {
			c.Status, c.Detail = OK, p
			return c
		}
	}
	c.Status, c.Detail = Warn, "not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing"
	c.Fix = "mount -t tracefs tracefs /sys/kernel/tracing: kprobes (the stage probes) fall back to it where the kernel has no kprobe PMU; the datapath does not need it"
	return c
}

// probeProg loads the smallest tc program (return 0), to attach in the tcx probe.
func probeProg() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "prg_doctor",
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

// tcxCheck attaches a program to an interface index that does not exist: a kernel with tcx
// refuses the device (ENODEV), one without refuses the attach type. Nothing is attached.
func tcxCheck() Check {
	c := Check{Name: "tcx"}
	prog, err := probeProg()
	if err != nil {
		c.Status, c.Detail = Fail, "cannot load a BPF program: "+err.Error()
		c.Fix = "run as root (or with CAP_BPF and CAP_NET_ADMIN)"
		return c
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	have := "bpf_link tc attach (tcx) works"
	switch {
	case err == nil:
		l.Close()
	case errors.Is(err, unix.ENODEV):
		err, have = nil, "bpf_link tc attach (tcx) is available"
	case !errors.Is(err, ebpf.ErrNotSupported):
		err = fmt.Errorf("tcx probe: %w", err)
	}
	probed(&c, err, have, "the kernel has no tcx",
		"use a 6.6 or later kernel: peregrine attaches, replaces and adopts its tc programs as tcx links",
		"run as root (or with CAP_BPF and CAP_NET_ADMIN)")
	return c
}

func redirectPeerCheck() Check {
	c := Check{Name: "redirect_peer"}
	err := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectPeer)
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		err = fmt.Errorf("probe: %w", err)
	}
	probed(&c, err, "bpf_redirect_peer is available to tc programs", "the kernel has no bpf_redirect_peer",
		"use a newer kernel (5.10 added it): fastpath and prism hand frames to pods with it",
		"run as root (or with CAP_BPF)")
	return c
}

// probed sets c from the outcome of a kernel feature probe: OK with have when err is nil; Fail
// with missing and upgrade (the fix) when the kernel lacks the feature; otherwise Fail with the
// probe's own error and privileges as the fix, since a probe run without the capabilities to
// load or attach a program fails that way.
func probed(c *Check, err error, have, missing, upgrade, privileges string) {
	switch {
	case err == nil:
		c.Status, c.Detail = OK, have
	case errors.Is(err, ebpf.ErrNotSupported):
		c.Status, c.Detail, c.Fix = Fail, missing, upgrade
	default:
		c.Status, c.Detail, c.Fix = Fail, err.Error(), privileges
	}
}
