package fastpath

import "testing"

// TestIPv6ServiceFlowMarkedLiberal: the agent's liberal marking (and its marking before a
// forget) covers a translated IPv6 flow under the tuple conntrack keeps its entry by, the
// original direction the pod sent (to the ClusterIP), and skips its alias (the translated
// key: no connection of its own), as for IPv4.
func TestIPv6ServiceFlowMarkedLiberal(t *testing.T) {
	tbl := flowTable[fpFpKey6, ctTuple6]{tuple: tuple6}
	fk, ak := key6(pod6A, svc6, 40000, 80, 6), key6(pod6A, pod6B, 40000, 5201, 6)
	tu, ok := tbl.learnedTCP(fk, &fpFpFlow{Flags: fOut | fIn | fDNAT})
	if !ok || tu.src != fk.Local || tu.dst != fk.Remote || tu.sport != fk.Lport || tu.dport != fk.Rport {
		t.Fatalf("translated flow: %+v %v, want the original tuple pod A -> ClusterIP:80", tu, ok)
	}
	if nl := tu.nl(); nl.Dst != svc6 || nl.Src != pod6A || nl.Dport != 80 || nl.Sport != 40000 {
		t.Fatalf("conntrack tuple %+v, want pod A:40000 -> [%v]:80", nl, svc6)
	}
	if _, ok := tbl.learnedTCP(ak, &fpFpFlow{Flags: fAlias}); ok {
		t.Fatal("the alias is marked: it is no connection")
	}
	if _, ok := tbl.learnedTCP(key6(pod6A, svc6, 40000, 80, 17), &fpFpFlow{Flags: fOut | fIn | fDNAT}); ok {
		t.Fatal("a UDP flow is marked")
	}
}
