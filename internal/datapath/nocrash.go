//go:build !peregrine_crashtest

package datapath

// crashPoint is a no-op outside test builds (see crash.go): no environment variable can make a
// production peregrine exit halfway through an attach.
func crashPoint(string) {}
