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
	for _, bad := range []string{"127.0.0.1:7001", "0@h:1", "x@h:1", "1@h", "1@h:99999", "1@:7001", "1@a:1,1@b:2", "4294967296@h:1"} {
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
	// Raft ids keep the node id in their low 32 bits.
	if err := (&Config{NodeID: 1 << 32, Bind: "127.0.0.1:1"}).Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("node id 1<<32: %v", err)
	}
	if err := (&Config{NodeID: 1<<32 - 1, Bind: "127.0.0.1:1"}).Validate(); err != nil {
		t.Errorf("node id 1<<32-1: %v", err)
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

// Validate catches peer lists that cannot work, whatever the node id's
// source (flag or data dir): this node named at another address, two
// nodes at one address, a cluster address that is another node's health
// endpoint, and a health endpoint the peers will not look for.
func TestValidatePeerAddresses(t *testing.T) {
	ok := Config{NodeID: 1, Bind: "127.0.0.1:7000", Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7010"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, c := range map[string]Config{
		"self at another address":               {NodeID: 1, Bind: "127.0.0.1:7000", Peers: map[uint64]string{1: "127.0.0.1:7005", 2: "127.0.0.1:7010"}},
		"two nodes at one address":              {NodeID: 1, Bind: "127.0.0.1:7000", Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7010", 3: "127.0.0.1:7010"}},
		"cluster address is another's health":   {NodeID: 1, Bind: "127.0.0.1:7000", Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7001"}},
		"health endpoint the peers do not poll": {NodeID: 1, Bind: "127.0.0.1:7000", HealthBind: "127.0.0.1:7005", Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7010"}},
	} {
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: Validate() = %v, want ErrBadConfig", name, err)
		}
	}
	// The health endpoint may bind another host at the expected port, and
	// the etcd provider has no health endpoint to collide.
	for name, c := range map[string]Config{
		"wildcard health host": {NodeID: 1, Bind: "127.0.0.1:7000", HealthBind: "0.0.0.0:7001", Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7010"}},
		"etcd, adjacent ports": {NodeID: 1, Bind: "127.0.0.1:7000", Provider: ProviderEtcd, EtcdEndpoints: []string{"127.0.0.1:2379"}, Peers: map[uint64]string{1: "127.0.0.1:7000", 2: "127.0.0.1:7001"}},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v, want nil", name, err)
		}
	}
}
