package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
)

// readyz returns the status code and body of a node's /readyz.
func readyz(p *proc) (int, string, error) {
	resp, err := http.Get("http://" + p.AdminAddr() + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// TestPausedLeaderFailover (issue 14 §6): three nodes, an RF=3 topic under
// load with the default 30 s request timeout. The leader of partition 0
// is frozen with SIGSTOP for 7 s. The others elect a new leader within
// about a second; the producers must follow it while the old one is still
// frozen (before, they waited out the whole pause on the frozen node).
func TestPausedLeaderFailover(t *testing.T) {
	const pause = 7 * time.Second
	tc, c := clusterWithTopic(t, "orders", 1)
	load := startLoad(t, tc.addrs(), "orders", 2, 1, 2*time.Millisecond)
	since := time.Now()
	checkFor(t, 30*time.Second, "acks before the pause", func() error {
		if n := load.countSince(0, since); n < 200 {
			return fmt.Errorf("%d acks", n)
		}
		return nil
	})
	victim, p, pausedAt := freezeLeader(t, tc, c, "orders", 0)
	var resumed time.Duration
	for time.Since(pausedAt) < pause {
		if resumed == 0 && load.countSince(0, pausedAt) >= 20 {
			resumed = time.Since(pausedAt)
		}
		time.Sleep(10 * time.Millisecond) // polling the acks, not synchronising
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stall := load.longestStall(0, pausedAt)
	t.Logf("leader node %d frozen for %v: writes stalled %v (20 acks %v after the freeze)", victim, pause, stall.Round(time.Millisecond), resumed.Round(time.Millisecond))
	if resumed == 0 {
		t.Fatalf("writes to partition 0 did not resume during the %v the leader was frozen", pause)
	}
	if stall > pause-2*time.Second {
		t.Fatalf("writes stalled %v of a %v pause", stall, pause)
	}
	checkFor(t, 30*time.Second, "acks after the thaw", func() error {
		if n := load.countSince(0, time.Now().Add(-time.Second)); n < 20 {
			return fmt.Errorf("%d acks in the last second", n)
		}
		return nil
	})
	load.finish()
	if load.failed > 0 {
		t.Fatalf("%d records failed; last: %v", load.failed, load.lastErr)
	}
}

// TestRestartUnderLoadReady (issue 14 §5, §6): a node is SIGKILLed under
// load and restarted. From the moment it serves, clients that know only
// it produce and describe the topic: it answers NOT_READY (retried by the
// SDK) until it has the cluster's metadata, never TOPIC_NOT_FOUND. Its
// /readyz turns 200, and "herald ready" is logged, only once each local
// replica is readable up to every offset acknowledged before the kill.
func TestRestartUnderLoadReady(t *testing.T) {
	const parts = 3
	tc, _ := clusterWithTopic(t, "orders", parts)
	load := startLoad(t, tc.addrs(), "orders", 2, parts, 2*time.Millisecond)
	checkFor(t, 30*time.Second, "acks before the kill", func() error {
		if n := load.count(); n < 2000 {
			return fmt.Errorf("%d acks", n)
		}
		return nil
	})
	victim := uint64(2)
	p := tc.nodes[victim]
	p.Kill(t)
	// Every offset acknowledged before the kill, per partition.
	ackedEnd := make([]int64, parts)
	load.mu.Lock()
	for _, a := range load.acked {
		ackedEnd[a.partition] = max(ackedEnd[a.partition], a.offset+1)
	}
	load.mu.Unlock()
	checkFor(t, 30*time.Second, "acks with node 2 down", func() error {
		if n := load.countSince(0, time.Now().Add(-time.Second)); n < 20 {
			return fmt.Errorf("%d acks in the last second", n)
		}
		return nil
	})
	p.Start(t)
	startedAt := time.Now()
	// Clients of the restarted node alone, from the moment it serves.
	only, err := client.Dial(ctxT(t, 10*time.Second), p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	prod := only.NewProducer(client.WithManualPartitions())
	ctx := ctxT(t, 60*time.Second)
	if _, err := only.DescribeTopic(ctx, "orders"); err != nil {
		t.Fatalf("describe on the restarted node: %v", err)
	}
	for i := 0; i < 20; i++ {
		if _, err := prod.Send(ctx, &client.Message{Topic: "orders", Partition: int32(i % parts), Value: []byte(fmt.Sprintf("only-%d", i))}); err != nil {
			t.Fatalf("produce through the restarted node: %v", err)
		}
	}
	prod.Close(ctx)
	var readyAfter time.Duration
	checkFor(t, 60*time.Second, "/readyz 200 on the restarted node", func() error {
		code, body, err := readyz(p)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		readyAfter = time.Since(startedAt)
		return nil
	})
	// Readable to what was acknowledged before the kill, as it said.
	info, err := only.DescribeTopic(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for i, pi := range info.Partitions {
		if pi.HighWatermark < ackedEnd[i] {
			t.Errorf("partition %d: ready with high watermark %d, but offsets up to %d were acknowledged before the kill", i, pi.HighWatermark, ackedEnd[i])
		}
	}
	if !strings.Contains(p.logs(), `msg="herald ready"`) {
		t.Errorf("no \"herald ready\" in the restarted node's log")
	}
	t.Logf("restarted node 2 ready %v after it logged \"herald serving\"; acked ends before the kill %v, high watermarks when ready %v",
		readyAfter.Round(time.Millisecond), ackedEnd, []int64{info.Partitions[0].HighWatermark, info.Partitions[1].HighWatermark, info.Partitions[2].HighWatermark})
	load.finish()
	if load.failed > 0 {
		t.Fatalf("%d records failed; last: %v", load.failed, load.lastErr)
	}
}

// freezeLeader SIGSTOPs the node leading topic's partition part (SIGCONT at
// cleanup) and returns its id, its process and when it was frozen.
func freezeLeader(t *testing.T, tc *testCluster, c *client.Client, topic string, part int) (uint64, *proc, time.Time) {
	t.Helper()
	victim := uint64(leaderOf(t, c, topic, part))
	if victim == 0 {
		t.Fatalf("no leader of partition %d", part)
	}
	p := tc.nodes[victim]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGCONT) })
	return victim, p, time.Now()
}
