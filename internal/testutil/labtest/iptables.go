package labtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// FirstRule inserts rule (what follows -I: the chain, then the match and target) at the head
// of its chain in namespace ns with ipt ("iptables", "iptables-nft"), waiting 5 s at most for
// the xtables lock, and returns its removal, also registered as cleanup: it runs once, and a
// rule it cannot remove is reported, since it would outlive the test. A failed insert fails
// the test.
func FirstRule(t testing.TB, ns, ipt string, rule ...string) (remove func()) {
	t.Helper()
	iptables := func(op string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return netnsutil.Run(ctx, ns, append([]string{ipt, "-w", "5", op}, rule...)...)
	}
	if out, err := iptables("-I"); err != nil {
		t.Fatalf("%s -I %v in %s: %v\n%s", ipt, rule, ns, err, out)
	}
	var once sync.Once
	remove = func() {
		once.Do(func() {
			if out, err := iptables("-D"); err != nil {
				t.Errorf("%s -D %v in %s: %v\n%s", ipt, rule, ns, err, out)
			}
		})
	}
	t.Cleanup(remove)
	return remove
}
