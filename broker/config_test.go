package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/actors/partition"
)

// The cluster settings are checked with the node's own id when it is
// given, and without a false alarm when it comes from the data dir.
func TestValidateClusterPeers(t *testing.T) {
	base := func() Config {
		c := Default()
		c.Cluster = "127.0.0.1:7000"
		c.Peers = "1@127.0.0.1:7000,2@127.0.0.1:7010"
		return c
	}
	c := base()
	c.NodeID = 1
	if err := c.Validate(); err != nil {
		t.Fatalf("node 1 at its peer address: %v", err)
	}
	c = base() // node id from the data dir
	if err := c.Validate(); err != nil {
		t.Fatalf("no --node-id: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"self elsewhere":   func(c *Config) { c.NodeID = 2 },
		"two at one":       func(c *Config) { c.Peers += ",3@127.0.0.1:7010" },
		"health off port":  func(c *Config) { c.ClusterHealth = "127.0.0.1:7005" },
		"health is a peer": func(c *Config) { c.Peers += ",3@127.0.0.1:7011" },
	} {
		c := base()
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `setting "cluster"`) {
			t.Errorf("%s: Validate() = %v", name, err)
		}
	}
}

// The sync pace is between 0 (off) and partition.MaxSyncPace, and it
// reaches the partitions only when the flush policy syncs before the ack
// (an interval policy syncs in the background: nothing to pace).
func TestLogSyncPace(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, partition.MaxSyncPace + time.Millisecond} {
		c := Default()
		c.LogSyncPace = d
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"log-sync-pace"`) {
			t.Errorf("pace %v: Validate() = %v", d, err)
		}
	}
	c := Default()
	if err := c.Validate(); err != nil || c.syncPace() != 2*time.Millisecond {
		t.Fatalf("default: Validate() = %v, pace %v", err, c.syncPace())
	}
	c.Flush = "interval:50ms"
	if err := c.Validate(); err != nil || c.syncPace() != 0 {
		t.Fatalf("interval flush: Validate() = %v, pace %v", err, c.syncPace())
	}
}
