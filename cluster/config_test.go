package cluster

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
)

func TestParsePeers(t *testing.T) {
	p, err := ParsePeers("1@127.0.0.1:7001, 2@[::1]:7002,3@h:7003")
	if err != nil || len(p) != 3 || p[2] != "[::1]:7002" {
		t.Fatalf("ParsePeers: %v %v", p, err)
	}
	for _, bad := range []string{"127.0.0.1:7001", "0@h:1", "x@h:1", "1@h", "1@h:99999", "1@:7001", "1@a:1,1@b:2"} {
		if _, err := ParsePeers(bad); !errors.Is(err, ErrBadConfig) {
			t.Errorf("ParsePeers(%q) = %v, want ErrBadConfig", bad, err)
		}
	}
	if err := (&Config{NodeID: 1, Bind: "127.0.0.1:1", Provider: "zk"}).Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("unknown provider: %v", err)
	}
	if err := (&Config{NodeID: 1, Bind: "127.0.0.1:1", Provider: ProviderEtcd}).Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("etcd without endpoints: %v", err)
	}
}

// A node whose addresses are taken fails to start with an error naming the
// address, and does not hang or panic.
func TestStartFailsOnTakenAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Health endpoint taken.
	_, err = Start(Config{NodeID: 1, Bind: freeAddr, HealthBind: busy.Addr().String(), Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("health address taken: %v", err)
	}
	// Cluster address taken.
	_, err = Start(Config{NodeID: 1, Bind: busy.Addr().String(), HealthBind: freeAddr, Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("cluster address taken: %v", err)
	}
}
