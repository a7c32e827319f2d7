// Package drift holds only tests: checks that fail when two copies of one truth drift apart.
// Generated code against its sources (go generate leaves the tree unchanged) lives here; the
// PipeDevice layout (Go against libpd's C) is checked in internal/pipedevice, and the Go mirrors of
// BPF logic beside each mirror.
package drift
