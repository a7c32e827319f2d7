package k8s

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The cluster's PKI, as kubeadm would make it but in-process: one CA, a serving certificate for
// the apiserver, a client certificate per component (its user and group are what RBAC sees),
// the service-account signing key, and a kubeconfig per client. ECDSA P-256 keeps it fast
// (RSA-2048 key generation costs ~100 ms each on this machine's 2 vCPUs).

type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	server string // https://<apiserver>:6443
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	return k, der, err
}

var serial int64 = 1

func newPKI(dir, server string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	k, der, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "prg-k8s-ca"},
		NotBefore: now, NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	c, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(c)
	p := &pki{dir: dir, caCert: ca, caKey: k, server: server}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", c); err != nil {
		return nil, err
	}
	if err := writePEM(p.path("ca.key"), "EC PRIVATE KEY", der); err != nil {
		return nil, err
	}
	// The service-account token signer (apiserver signs, controller-manager signs, apiserver verifies).
	_, sder, err := newKey()
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), "EC PRIVATE KEY", sder); err != nil {
		return nil, err
	}
	sk, _ := x509.ParseECPrivateKey(sder)
	pub, _ := x509.MarshalPKIXPublicKey(&sk.PublicKey)
	return p, writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// cert issues name.crt/name.key for CN cn in group org; with ips or dns it is also a serving
// certificate for those names.
func (p *pki) cert(name, cn, org string, ips []net.IP, dns []string) error {
	k, der, err := newKey()
	if err != nil {
		return err
	}
	serial++
	subj := pkix.Name{CommonName: cn}
	if org != "" {
		subj.Organization = []string{org}
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: subj,
		NotBefore: p.caCert.NotBefore, NotAfter: p.caCert.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: ips, DNSNames: dns,
	}
	if len(ips)+len(dns) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	c, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &k.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", name, err)
	}
	if err := writePEM(p.path(name+".crt"), "CERTIFICATE", c); err != nil {
		return err
	}
	return writePEM(p.path(name+".key"), "EC PRIVATE KEY", der)
}

// kubeconfig writes name.kubeconfig for the client certificate name, everything embedded.
func (p *pki) kubeconfig(name string) error {
	rd := func(f string) string {
		b, _ := os.ReadFile(p.path(f))
		return base64.StdEncoding.EncodeToString(b)
	}
	y := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: prg-k8s
  cluster: {certificate-authority-data: %s, server: %q}
users:
- name: %s
  user: {client-certificate-data: %s, client-key-data: %s}
contexts:
- name: prg-k8s
  context: {cluster: prg-k8s, user: %s}
current-context: prg-k8s
`, rd("ca.crt"), p.server, name, rd(name+".crt"), rd(name+".key"), name)
	return os.WriteFile(p.path(name+".kubeconfig"), []byte(y), 0o600)
}

// makeAll issues everything the cluster with the given node names needs.
func (p *pki) makeAll(apiserver net.IP, svcIP net.IP, nodes []string) error {
	if err := p.cert("apiserver", "kube-apiserver", "", []net.IP{apiserver, svcIP, net.ParseIP("127.0.0.1")},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}); err != nil {
		return err
	}
	clients := []struct{ name, cn, org string }{
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
		{"admin", "kubernetes-admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kube-proxy", "system:kube-proxy", ""},
		{"flannel", "flannel", ""},
		{"kube-router", "kube-router", ""},
	}
	for _, n := range nodes {
		clients = append(clients, struct{ name, cn, org string }{"kubelet-" + n, "system:node:" + n, "system:nodes"})
	}
	for _, c := range clients {
		if err := p.cert(c.name, c.cn, c.org, nil, nil); err != nil {
			return err
		}
		if c.name == "apiserver-kubelet-client" {
			continue
		}
		if err := p.kubeconfig(c.name); err != nil {
			return err
		}
	}
	return nil
}
