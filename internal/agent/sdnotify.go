package agent

import (
	"log/slog"
	"net"
	"os"
)

// sdNotify tells systemd (Type=notify: $NOTIFY_SOCKET) about the agent's state: READY=1 once
// it handles signals, holds its lock, has a valid config and listens. Until then systemd holds
// back `systemctl reload` (whose SIGHUP would kill a Go program that has not called
// signal.Notify yet) and reports a start that fails (bad config, another agent) as failed.
// Without $NOTIFY_SOCKET it does nothing.
func sdNotify(state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	if addr[0] == '@' { // abstract namespace
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		slog.Warn("sd_notify", "err", err)
		return
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		slog.Warn("sd_notify", "err", err)
	}
}
