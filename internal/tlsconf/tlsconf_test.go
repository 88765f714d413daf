package tlsconf

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeLeaf(t *testing.T, ca *CA, dir, name string, client bool) {
	t.Helper()
	l, err := ca.Issue(LeafSpec{Name: name, Hosts: []string{"127.0.0.1"}, Client: client, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(dir, name); err != nil {
		t.Fatal(err)
	}
}

// A reload reads new files; a reload of broken files keeps the
// configuration in use and names the file at fault.
func TestServerReloadKeepsTheLastGoodFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeLeaf(t, ca, dir, "server", false)
	s, err := NewServer(ServerFiles{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		cfg, _ := s.Config().GetConfigForClient(&tls.ClientHelloInfo{})
		return cfg.Certificates[0].Leaf.SerialNumber.String()
	}
	first := serial()
	if s.Changed() {
		t.Fatal("changed right after the load")
	}
	writeLeaf(t, ca, dir, "server", false)
	// The mtime resolution may hide a rewrite within the same tick.
	future := time.Now().Add(time.Minute)
	os.Chtimes(filepath.Join(dir, "server.pem"), future, future)
	if !s.Changed() {
		t.Fatal("a rewritten certificate is not seen as changed")
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	second := serial()
	if second == first {
		t.Fatal("the reload kept the old certificate")
	}
	os.WriteFile(filepath.Join(dir, "server-key.pem"), []byte("not a key"), 0o600)
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "server-key.pem") {
		t.Fatalf("reload of a broken key: %v", err)
	}
	if serial() != second {
		t.Fatal("a failed reload replaced the certificate in use")
	}
}

func TestClientAndServerFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewServer(ServerFiles{Cert: "x.pem"}, nil); err == nil {
		t.Fatal("a server without a key")
	}
	if _, err := NewServer(ServerFiles{Cert: filepath.Join(dir, "none.pem"), Key: filepath.Join(dir, "none-key.pem")}, nil); err == nil || !strings.Contains(err.Error(), "none.pem") {
		t.Fatalf("missing files: %v", err)
	}
	if _, err := Client(ClientFiles{Cert: "c.pem"}); err == nil {
		t.Fatal("a client certificate without a key")
	}
	os.WriteFile(filepath.Join(dir, "empty.pem"), []byte("nothing"), 0o644)
	if _, err := Client(ClientFiles{CA: filepath.Join(dir, "empty.pem")}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("a CA file without certificates: %v", err)
	}
}

// WriteDevCerts writes files that load as a server and a client
// configuration, with the client's name as its principal, and refuses to
// overwrite them.
func TestWriteDevCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := WriteDevCerts(dir, []string{"broker.example"}, "ops", 2); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		cfg, err := Client(ClientFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, fmt.Sprintf("node-%d.pem", id)), Key: filepath.Join(dir, fmt.Sprintf("node-%d-key.pem", id))})
		if err != nil {
			t.Fatal(err)
		}
		leaf := cfg.Certificates[0].Leaf
		if err := NamesNode(leaf, id); err != nil {
			t.Fatal(err)
		}
		if err := NamesNode(leaf, id+5); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("names node [%d], not node %d", id, id+5)) {
			t.Fatalf("node-%d names node %d: %v", id, id+5, err)
		}
	}
	if _, err := NewServer(ServerFiles{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"), ClientCA: filepath.Join(dir, "ca.pem")}, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := Client(ClientFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	leaf := cfg.Certificates[0].Leaf
	if leaf.Subject.CommonName != "ops" {
		t.Fatalf("client certificate names %q", leaf.Subject.CommonName)
	}
	if st, _ := os.Stat(filepath.Join(dir, "client-key.pem")); st.Mode().Perm() != 0o600 {
		t.Fatalf("client key mode %v", st.Mode().Perm())
	}
	if err := WriteDevCerts(dir, nil, "ops", 2); err == nil || !strings.Contains(err.Error(), "not overwriting") {
		t.Fatalf("second WriteDevCerts: %v", err)
	}
}
