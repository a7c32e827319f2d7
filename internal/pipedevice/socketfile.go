package pipedevice

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/statepath"
)

// DefaultSocketDir holds the daemon's socket and nothing else, so that containers can get the
// socket by bind-mounting this directory read-only (-v /run/peregrine/pd:/run/peregrine/pd:ro):
// a unix socket in a read-only mount still accepts connections, and the container sees none of
// /run/peregrine's other files (datapath records, logs, the lock).
const DefaultSocketDir = statepath.PD

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = DefaultSocketDir + "/pd.sock"

// listenSocket listens on path. Only the default directory is made here (0755, root's); any other
// socket's directory must exist, be a real directory and not be writable by others (unless
// sticky), and the only thing removed at path is a stale socket (one nobody answers on).
func listenSocket(path string, isDefault bool) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if isDefault {
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("socket directory: %w", err)
			}
		}
	}
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("socket directory %s does not exist: create it first (a directory of its own, owned by root, mode 0755; containers mount it read-only)", dir)
	case err != nil:
		return nil, err
	case !fi.IsDir():
		return nil, fmt.Errorf("socket directory %s is not a directory (symlinks are refused)", dir)
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return nil, fmt.Errorf("socket directory %s is writable by others (mode %v): anyone could replace the socket; use a directory of its own", dir, fi.Mode().Perm())
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket (mode %v): refusing to remove it", path, fi.Mode())
		}
		c, err := net.Dial("unixpacket", path)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("a daemon already serves %s", path)
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			return nil, fmt.Errorf("%s: cannot tell whether it is stale: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	// Containers run as any user; access control is per network namespace and per quota, not
	// by file mode.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
