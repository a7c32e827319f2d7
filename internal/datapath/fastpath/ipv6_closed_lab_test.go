package fastpath

import "testing"

// TestLabIPv6ClosedLeaveNoConntrack is TestLabClosedLeaveNoConntrack between two dual-stack
// pods' IPv6 addresses (the lab's --ipv6): short IPv6 connections ride the fast path from
// their handshake to their close (FP_F_HSONLY, bpf/fastpath6.h), each close hands the
// connection to the agent in an IPv6 ring record, and the agent deletes its conntrack entry
// by id (ctclosed.go): no entry is left on either node, with INVALID dropped on both as
// kube-proxy's ip6tables rules do, and the client's ports wrapping every 1024 connections.
func TestLabIPv6ClosedLeaveNoConntrack(t *testing.T) { closedLeaveNoConntrack(t, true) }
