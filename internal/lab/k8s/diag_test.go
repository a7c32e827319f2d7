package k8s

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// diag logs what explains a fast-path failure on the cluster: each node's agent log tail,
// peregrine status, the conntrack table and the filter table's drop counters.
func diag(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=peregrine", "--tail=40", "--prefix")
	fmt.Fprintf(&b, "agent logs:\n%s\n", logs)
	for i := 1; i <= c.Spec.Nodes; i++ {
		for _, argv := range [][]string{{agentBin, "status"}, {"sh", "-c", "conntrack -L 2>/dev/null | grep -v 'dport=2379\\|dport=6443\\|dport=8472\\|dport=8080\\|dport=9465'"}, {"sh", "-c", "bpftool map dump pinned $(find /sys/fs/bpf -name prg_fastpath_flow | head -1) | head -c 20000"}, {"sh", "-c", "iptables-save -c -t filter | grep -v '^\\[0:0\\]' | grep -i 'invalid\\|DROP\\|REJECT'"}, {"cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"}} {
			out, err := Exec(ctx, i, argv...).CombinedOutput()
			fmt.Fprintf(&b, "--- %s: %s (%v)\n%s\n", NodeName(i), strings.Join(argv, " "), err, out)
		}
	}
	t.Log(b.String())
}
