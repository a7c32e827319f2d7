package datapath

import (
	"fmt"
	"log/slog"
)

// Logger is what a mode's agent (and the Watch loop) logs to: a *slog.Logger, so that every line
// of the project goes through slog (the node agent's handler for a hosted agent, a text handler
// on stderr, which is the log file, for a detached one), tagged with the mode and target. It
// keeps Printf and Print, so an agent's one-line messages ("endpoints: %d live, ...") are written
// as they were: each becomes one Info record whose message is the formatted line. The slog
// methods (Info, Warn, With ...) are there too, for structured lines.
type Logger struct{ *slog.Logger }

// NewLogger wraps l; nil means slog's default logger.
func NewLogger(l *slog.Logger) Logger {
	if l == nil {
		l = slog.Default()
	}
	return Logger{l}
}

// DiscardLogger drops everything (a one-off sync that reports its outcome by its result).
func DiscardLogger() Logger { return Logger{slog.New(slog.DiscardHandler)} }

// Printf logs fmt.Sprintf(format, args...) at level Info.
func (l Logger) Printf(format string, args ...any) { l.get().Info(fmt.Sprintf(format, args...)) }

// Print logs fmt.Sprint(args...) at level Info.
func (l Logger) Print(args ...any) { l.get().Info(fmt.Sprint(args...)) }

// get is the slog logger underneath; the zero Logger logs to slog's default.
func (l Logger) get() *slog.Logger {
	if l.Logger == nil {
		return slog.Default()
	}
	return l.Logger
}
