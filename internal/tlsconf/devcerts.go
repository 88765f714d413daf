package tlsconf

// Development certificates: a CA and certificates it signs, for trying TLS
// out and for tests. Never for production: the CA's key sits next to the
// certificates.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	der  []byte
}

// NewCA makes a self-signed CA valid for validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name, Organization: []string{"Herald development"}},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, der: der}, nil
}

// Leaf is a certificate and its key, PEM-encoded.
type Leaf struct{ CertPEM, KeyPEM []byte }

// LeafSpec describes a certificate to issue.
type LeafSpec struct {
	Name      string   // the subject's common name (a client's principal)
	Hosts     []string // DNS names and IP addresses (server certificates)
	Client    bool     // for client authentication, else for a server
	Node      bool     // for both (a cluster node: it serves and dials)
	NodeID    uint64   // a node's id, as the URI urn:herald:node:ID (NodeIDs)
	NotBefore time.Time
	NotAfter  time.Time
}

// Issue signs a certificate for spec.
func (ca *CA) Issue(spec LeafSpec) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: spec.Name, Organization: []string{"Herald development"}},
		NotBefore: spec.NotBefore, NotAfter: spec.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	switch {
	case spec.Node:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	case spec.Client:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if spec.NodeID != 0 {
		tmpl.URIs = append(tmpl.URIs, NodeURI(spec.NodeID))
	}
	for _, h := range spec.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return Leaf{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// CertPEM is the CA's certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Write writes the leaf as name.pem and name-key.pem (mode 0600) in dir.
func (l Leaf) Write(dir, name string) error {
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), l.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+"-key.pem"), l.KeyPEM, 0o600)
}

// DevCertFiles are the files WriteDevCerts writes in its directory for
// nodes node certificates.
func DevCertFiles(nodes int) []string {
	out := []string{"ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"}
	for i := 1; i <= nodes; i++ {
		out = append(out, fmt.Sprintf("node-%d.pem", i), fmt.Sprintf("node-%d-key.pem", i))
	}
	return out
}

// DevValidity is how long development certificates are valid.
const DevValidity = 365 * 24 * time.Hour

// WriteDevCerts writes a development CA (ca.pem; its key is not kept), a
// server certificate for localhost, 127.0.0.1, ::1 and hosts
// (server.pem, server-key.pem), and a client certificate whose principal
// is client (client.pem, client-key.pem), and node certificates for the
// cluster port, for the same names, naming node ids 1 to nodes
// (node-N.pem, node-N-key.pem), into dir,
// creating it. It refuses
// to overwrite existing files.
func WriteDevCerts(dir string, hosts []string, client string, nodes int) error {
	if client == "" {
		return errors.New("dev-certs: the client certificate needs a name")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range DevCertFiles(nodes) {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("dev-certs: %s exists; not overwriting it", filepath.Join(dir, f))
		}
	}
	ca, err := NewCA("Herald development CA", DevValidity)
	if err != nil {
		return err
	}
	now := time.Now()
	server, err := ca.Issue(LeafSpec{Name: "herald", Hosts: append([]string{"localhost", "127.0.0.1", "::1"}, hosts...),
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(DevValidity)})
	if err != nil {
		return err
	}
	cl, err := ca.Issue(LeafSpec{Name: client, Client: true, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(DevValidity)})
	if err != nil {
		return err
	}
	for id := 1; id <= nodes; id++ {
		node, err := ca.Issue(LeafSpec{Name: fmt.Sprintf("herald-node-%d", id), Node: true, NodeID: uint64(id),
			Hosts: append([]string{"localhost", "127.0.0.1", "::1"}, hosts...), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(DevValidity)})
		if err != nil {
			return err
		}
		if err := node.Write(dir, fmt.Sprintf("node-%d", id)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM(), 0o644); err != nil {
		return err
	}
	if err := server.Write(dir, "server"); err != nil {
		return err
	}
	return cl.Write(dir, "client")
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
