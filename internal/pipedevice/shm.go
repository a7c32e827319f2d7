package pipedevice

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// Memfd is one anonymous shared-memory file and the daemon's own mapping of it.
type Memfd struct {
	FD   int
	Size int
	Huge bool // backed by 2 MiB hugepages (MFD_HUGETLB); false: normal pages (fallback)
	Mem  []byte

	sealed atomic.Bool
}

// NewMemfd creates a memfd of size bytes, hugepage-backed when wantHuge and the size is a whole
// number of hugepages and the kernel has free hugepages; otherwise normal pages. Sealing the size
// keeps a client from shrinking the file under the daemon's mapping (SIGBUS in the engine).
//
// Size seals alone are not enough: a client holding a writable fd can punch a hole
// (fallocate PUNCH_HOLE, madvise MADV_REMOVE) and, with hugepages, the daemon's next touch of that
// range SIGBUSes when no free hugepage is left. So every memfd the daemon reads or writes gets
// F_SEAL_FUTURE_WRITE (SealWrites) before the engine touches it: the kernel then refuses hole
// punching and new writable mappings, while mappings made before the seal keep working. Memory
// only the daemon writes (receive rings in engine mode, the engine page) is sealed at once, so
// clients can map it read-only and nothing else; memory a client writes (its control queues and
// send pool, a direct-mode peer ring) is sealed when the client says it has mapped it (OpSeal),
// and the engine serves nothing from it before. Faults that get past this (a kernel without the
// seal) are contained by the engine (engine.go: guard).
func NewMemfd(name string, size int, wantHuge bool) (*Memfd, error) {
	if wantHuge && size%hugePage == 0 {
		if fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_HUGETLB|unix.MFD_ALLOW_SEALING); err == nil {
			if m, err := finishMemfd(fd, size, true); err == nil {
				return m, nil
			}
		}
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	return finishMemfd(fd, size, false)
}

func finishMemfd(fd, size int, huge bool) (*Memfd, error) {
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate memfd to %d: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap memfd: %w", err)
	}
	if huge {
		// Touch one byte: a hugetlb fault with no free hugepage would SIGBUS later, so fail now.
		if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
			unix.Munmap(mem)
			unix.Close(fd)
			return nil, err
		}
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	return &Memfd{FD: fd, Size: size, Huge: huge, Mem: mem}, nil
}

// SealWrites forbids, from now on, writable mappings, writes and hole punching (and any further
// seal); the mappings that exist keep working. Sealed says it happened.
func (m *Memfd) SealWrites() error {
	if _, err := unix.FcntlInt(uintptr(m.FD), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("seal memfd: %w", err)
	}
	m.sealed.Store(true)
	return nil
}

// Sealed says whether SealWrites succeeded.
func (m *Memfd) Sealed() bool { return m.sealed.Load() }

// Close unmaps and closes. Callers make sure the engine no longer touches Mem.
func (m *Memfd) Close() {
	if m == nil {
		return
	}
	if m.Mem != nil {
		unix.Munmap(m.Mem)
		m.Mem = nil
	}
	if m.FD >= 0 {
		unix.Close(m.FD)
		m.FD = -1
	}
}

// MapMirror maps size bytes of fd at off twice, back to back, so that a ring's wrapped-around
// bytes are contiguous in memory (pd_recv returns one pointer for any span up to the ring size).
func MapMirror(fd int, off int64, size int) ([]byte, error) {
	return mapMirror(fd, off, size, unix.PROT_READ|unix.PROT_WRITE)
}

// MapMirrorRO is MapMirror, read-only (a receive ring the daemon sealed).
func MapMirrorRO(fd int, off int64, size int) ([]byte, error) {
	return mapMirror(fd, off, size, unix.PROT_READ)
}

func mapMirror(fd int, off int64, size int, prot int) ([]byte, error) {
	resv, err := unix.Mmap(-1, 0, 2*size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	base := uintptr(unsafe.Pointer(&resv[0]))
	for i := 0; i < 2; i++ {
		addr := base + uintptr(i*size)
		_, _, e := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(size), uintptr(prot),
			unix.MAP_SHARED|unix.MAP_FIXED, uintptr(fd), uintptr(off))
		if e != 0 {
			unix.Munmap(resv)
			return nil, fmt.Errorf("mmap mirror: %w", e)
		}
	}
	return resv, nil
}

func u32At(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
func u64At(b []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&b[off])) }

func load32(b []byte, off int) uint32     { return atomic.LoadUint32(u32At(b, off)) }
func store32(b []byte, off int, v uint32) { atomic.StoreUint32(u32At(b, off), v) }
func load64(b []byte, off int) uint64     { return atomic.LoadUint64(u64At(b, off)) }
func store64(b []byte, off int, v uint64) { atomic.StoreUint64(u64At(b, off), v) }
