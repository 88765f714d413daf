package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// walSegments lists a partition directory's WAL segment files, oldest first.
func walSegments(t testing.TB, partDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(partDir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, e := range ents {
		if len(e.Name()) == 20 {
			segs = append(segs, filepath.Join(partDir, "wal", e.Name()))
		}
	}
	sort.Strings(segs)
	return segs
}

// flipByte flips one bit of the byte at the middle of path.
func flipByte(t testing.TB, path string, at float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		t.Fatalf("%s is empty", path)
	}
	i := int(float64(len(b)) * at)
	b[i] ^= 0x04
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// produceNumbered sends count records "v-%06d-xxx…" (size x's) one by one to partition 0
// and returns them with their offsets.
func produceNumbered(t *testing.T, c *client.Client, topic string, from, count, size int) map[int64]string {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	p := c.NewProducer(client.WithManualPartitions())
	out := map[int64]string{}
	for i := from; i < from+count; i++ {
		v := fmt.Sprintf("v-%06d-%s", i, strings.Repeat("x", size))
		r, err := p.Send(ctx, &client.Message{Topic: topic, Partition: 0, Value: []byte(v)})
		if err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
		out[r.Offset] = v
	}
	return out
}

// damagedErr asserts err is PARTITION_DAMAGED and returns it.
func damagedErr(t *testing.T, err error) *client.Error {
	t.Helper()
	var he *client.Error
	if !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_PARTITION_DAMAGED {
		t.Fatalf("want PARTITION_DAMAGED, got %v", err)
	}
	return he
}

// TestFlippedByteKeepsEveryRecordBeforeIt is issue 14's reproduction: 1,000
// records, a clean stop, one flipped byte in the middle of the partition's
// only WAL segment, a restart. Before the fix the broker cut the log at
// the flip, served none of the later records, and gave their offsets to
// new ones. Now it keeps and serves every record before the damage, refuses
// produces with PARTITION_DAMAGED naming the offsets lost, says so in its
// log and metrics, and after `herald partition repair --accept-loss` takes
// writes again at offsets past every lost one.
func TestFlippedByteKeepsEveryRecordBeforeIt(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	if _, err := c.CreateTopic(ctx, "t", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	written := produceNumbered(t, c, "t", 0, 1000, 90)
	c.Close()
	n.Stop(t)
	partDir := filepath.Join(n.DataDir(), "topics", "t-0")
	segs := walSegments(t, partDir)
	flipByte(t, segs[0], 0.5)

	n.Start(t)
	c = dial(t, n)
	// Every record before the damage is served, unchanged, at its offset.
	kept := readPartition(t, c, "t", 0)
	if len(kept) == 0 || len(kept) >= 1000 {
		t.Fatalf("kept %d records; want the ones before the middle of the log", len(kept))
	}
	for i, m := range kept {
		if m.Offset != int64(i) || string(m.Value) != written[m.Offset] {
			t.Fatalf("record %d: offset %d value %q, want %q", i, m.Offset, m.Value, written[int64(i)])
		}
	}
	// Writes are refused with the loss named.
	_, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "t", Partition: 0, Value: []byte("new")})
	he := damagedErr(t, err)
	if he.LostFrom != int64(len(kept)) || he.LostTo != 1000 {
		t.Fatalf("lost [%d, %d), want [%d, 1000): %v", he.LostFrom, he.LostTo, len(kept), he)
	}
	if got := metricSum(t, n, "herald_partition_damaged"); got != 1 {
		t.Fatalf("herald_partition_damaged = %v, want 1", got)
	}
	if !strings.Contains(n.logs(), "the log is damaged") {
		t.Fatalf("the broker's log does not say the log is damaged:\n%s", n.logs())
	}
	if q, err := os.ReadDir(filepath.Join(partDir, "quarantine")); err != nil || len(q) != 1 {
		t.Fatalf("quarantine: %v %v", q, err)
	}

	// The operator's view, then the repair.
	out, stderr, code := herald(t, "", "partition", "repair", "t/0", "--addr", n.Addr())
	if code != 1 || !strings.Contains(out, fmt.Sprintf("offsets %d to 999 were lost", len(kept))) || !strings.Contains(out, "read-only") {
		t.Fatalf("repair without --accept-loss: code %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = herald(t, "", "partition", "repair", "t/0", "--accept-loss", "--addr", n.Addr())
	if code != 0 || !strings.Contains(out, "the next record gets offset 1000") {
		t.Fatalf("repair --accept-loss: code %d\n%s%s", code, out, stderr)
	}
	after := produceNumbered(t, c, "t", 1000, 5, 90)
	for off := range after {
		if off < 1000 {
			t.Fatalf("offset %d reused after the repair", off)
		}
	}
	if got := metricSum(t, n, "herald_partition_damaged"); got != 0 {
		t.Fatalf("herald_partition_damaged = %v after the repair, want 0", got)
	}
	// A consumer from the start reads the kept records, then the new ones.
	res, err := c.Fetch(ctx, "t", 0, int64(len(kept)), 1<<20, 0)
	if err != nil || len(res.Messages) == 0 || res.Messages[0].Offset != 1000 {
		t.Fatalf("fetch across the lost range: %+v %v", res, err)
	}
	// And it all survives a restart.
	c.Close()
	n.Stop(t)
	n.Start(t)
	c = dial(t, n)
	r, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "t", Partition: 0, Value: []byte("after restart")})
	if err != nil || r.Offset != 1005 {
		t.Fatalf("produce after restart: %v %v, want offset 1005", r, err)
	}
}

// TestLiveReadFindsCorruption damages an older segment while the broker
// runs. A catch-up read that finds it fails, the partition reopens its log,
// and the damage is handled as at start: read-only, PARTITION_DAMAGED.
func TestLiveReadFindsCorruption(t *testing.T) {
	n := startProc(t, t.TempDir(), "--segment-bytes", "1048576")
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	if _, err := c.CreateTopic(ctx, "live", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	// 6.4 MB: several segments, and more than the log's 4 MiB cache of
	// recent entries, so the oldest are read from their files.
	produceNumbered(t, c, "live", 0, 100, 64<<10)
	c.Close()
	n.Stop(t)
	n.Start(t) // the caches now hold only the tail
	c = dial(t, n)
	segs := walSegments(t, filepath.Join(n.DataDir(), "topics", "live-0"))
	if len(segs) < 3 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	flipByte(t, segs[0], 0.5)
	checkFor(t, 30*time.Second, "the partition to notice the damage", func() error {
		if _, err := c.Fetch(ctx, "live", 0, 0, 1<<20, 0); err != nil {
			var he *client.Error
			if errors.As(err, &he) && he.Code == heraldpb.ErrorCode_STORAGE_ERROR {
				return fmt.Errorf("fetch: %v", err) // the read found it; the reopen follows
			}
		}
		_, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "live", Partition: 0, Value: []byte("x")})
		var he *client.Error
		if errors.As(err, &he) && he.Code == heraldpb.ErrorCode_PARTITION_DAMAGED {
			return nil
		}
		return fmt.Errorf("produce: %v", err)
	})
	if !strings.Contains(n.logs(), "a read found corrupt data") {
		t.Fatalf("the damage was not found by a read:\n%s", n.logs())
	}
	kept := readPartition(t, c, "live", 0)
	if len(kept) == 0 || len(kept) >= 100 {
		t.Fatalf("kept %d records after the live damage", len(kept))
	}
}

// TestDamagedFollowerRebuildsFromLeader: RF=3. A follower's log is
// corrupted mid-way while it is stopped, more records are acknowledged
// without it, it restarts, and the leader is SIGKILLed at once. The damaged
// follower must not help elect a leader whose log is behind what it held:
// the third node, which has every acknowledged record, wins with its vote,
// writes go on, the follower rebuilds its log from the new leader, and in
// the end every acknowledged record is on every replica, offset for offset.
func TestDamagedFollowerRebuildsFromLeader(t *testing.T) {
	tc, c := clusterWithTopic(t, "dmg", 1)
	acked := produceNumbered(t, c, "dmg", 0, 600, 90)
	var leader uint64
	checkFor(t, 10*time.Second, "a leader", func() error {
		if leader = uint64(leaderOf(t, c, "dmg", 0)); leader == 0 {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	follower := uint64(1)
	for follower == leader {
		follower++
	}
	f := tc.nodes[follower]
	f.Stop(t)
	dirs, _ := filepath.Glob(filepath.Join(f.DataDir(), "replicas", "dmg-0-*"))
	if len(dirs) != 1 {
		t.Fatalf("replica dirs: %v", dirs)
	}
	flipByte(t, walSegments(t, dirs[0])[0], 0.5)
	for off, v := range produceNumbered(t, c, "dmg", 600, 200, 90) {
		acked[off] = v
	}
	f.Start(t)
	tc.nodes[leader].Kill(t)
	t.Logf("node %d (follower) restarted with a damaged log; node %d (leader) killed", follower, leader)
	checkFor(t, 60*time.Second, "writes to resume without the old leader", func() error {
		ctx := ctxT(t, 5*time.Second)
		r, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "dmg", Partition: 0, Value: []byte("v-resume")})
		if err != nil {
			return err
		}
		acked[r.Offset] = "v-resume"
		return nil
	})
	for off, v := range produceNumbered(t, c, "dmg", 800, 200, 90) {
		acked[off] = v
	}
	if !strings.Contains(f.logs(), "the log is damaged") {
		t.Fatalf("the follower did not find the damage:\n%s", f.logs())
	}
	tc.nodes[leader].Start(t)
	tc.waitRegistered(t, tc.nodes)
	checkFor(t, 60*time.Second, "the damaged follower to rebuild and every replica to catch up", func() error {
		return rebuiltAndCaughtUp(t, tc, f, "dmg")
	})
	c.Close()
	ackedOnEveryReplica(t, tc, "dmg", acked)
}

// TestEveryReplicaDamaged: RF=3, and each replica's log is corrupted at a
// different place while the cluster is stopped. No replica may lead (each
// withholds its vote from logs behind what it held), so the partition is
// read-only: produces get PARTITION_DAMAGED once it has stayed leaderless.
// `herald partition repair --accept-loss` accepts the loss on every
// replica with the largest lost end as the floor: a leader is elected,
// writes go on, and no offset any replica lost is reused.
func TestEveryReplicaDamaged(t *testing.T) {
	tc, c := clusterWithTopic(t, "alld", 1)
	acked := produceNumbered(t, c, "alld", 0, 600, 90)
	c.Close()
	for i, id := range []uint64{1, 2, 3} {
		tc.nodes[id].Stop(t)
		dirs, _ := filepath.Glob(filepath.Join(tc.nodes[id].DataDir(), "replicas", "alld-0-*"))
		if len(dirs) != 1 {
			t.Fatalf("replica dirs: %v", dirs)
		}
		flipByte(t, walSegments(t, dirs[0])[0], 0.3+0.2*float64(i))
	}
	for _, id := range []uint64{1, 2, 3} {
		tc.nodes[id].Start(t)
	}
	tc.waitRegistered(t, tc.nodes)
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkFor(t, 60*time.Second, "produce to be refused with PARTITION_DAMAGED", func() error {
		_, err := c.NewProducer(client.WithManualPartitions()).Send(ctxT(t, 10*time.Second), &client.Message{Topic: "alld", Partition: 0, Value: []byte("x")})
		var he *client.Error
		if errors.As(err, &he) && he.Code == heraldpb.ErrorCode_PARTITION_DAMAGED {
			return nil
		}
		return fmt.Errorf("produce: %v", err)
	})
	// Read-only: each node serves what its replica kept of the committed log.
	for _, id := range []uint64{1, 2, 3} {
		nc := dialNode(t, tc.nodes[id])
		kept := readPartition(t, nc, "alld", 0)
		nc.Close()
		if len(kept) == 0 {
			t.Fatalf("node %d serves no record of the damaged partition", id)
		}
		for _, m := range kept {
			if acked[m.Offset] != string(m.Value) {
				t.Fatalf("node %d serves %q at %d, acknowledged %q", id, m.Value, m.Offset, acked[m.Offset])
			}
		}
		t.Logf("node %d serves %d records read-only", id, len(kept))
	}
	out, stderr, code := herald(t, "", "partition", "repair", "alld/0", "--addr", tc.addrs())
	if code != 1 || strings.Count(out, "were lost") != 3 || !strings.Contains(out, "read-only") {
		t.Fatalf("repair without --accept-loss: code %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = herald(t, "", "partition", "repair", "alld/0", "--accept-loss", "--addr", tc.addrs())
	if code != 0 || strings.Count(out, "the loss is accepted") != 3 {
		t.Fatalf("repair --accept-loss: code %d\n%s%s", code, out, stderr)
	}
	var first int64 = -1
	checkFor(t, 60*time.Second, "writes after the repair", func() error {
		r, err := c.NewProducer(client.WithManualPartitions()).Send(ctxT(t, 10*time.Second), &client.Message{Topic: "alld", Partition: 0, Value: []byte("v-after")})
		if err != nil {
			return err
		}
		first = r.Offset
		return nil
	})
	if first < 600 {
		t.Fatalf("the first record after the repair got offset %d: offsets below 600 were acknowledged before", first)
	}
	checkFor(t, 60*time.Second, "every replica to catch up", func() error {
		hws, err := tc.highWatermarks(t, "alld", 0)
		if err != nil {
			return err
		}
		if hws[0] != hws[1] || hws[1] != hws[2] || hws[0] <= first {
			return fmt.Errorf("high watermarks %v", hws)
		}
		return nil
	})
	c.Close()
	var logs []map[int64]string
	for _, id := range []uint64{1, 2, 3} {
		tc.nodes[id].Stop(t)
		logs = append(logs, readReplica(t, tc.nodes[id].DataDir(), "alld", 0))
	}
	for i := 1; i < 3; i++ {
		if len(logs[i]) != len(logs[0]) {
			t.Fatalf("node %d holds %d records, node 1 %d", i+1, len(logs[i]), len(logs[0]))
		}
	}
	for off, v := range logs[0] {
		for i := 1; i < 3; i++ {
			if logs[i][off] != v {
				t.Fatalf("offset %d: node 1 %q, node %d %q", off, v, i+1, logs[i][off])
			}
		}
		if off < 600 && acked[off] != v {
			t.Fatalf("offset %d holds %q, acknowledged %q", off, v, acked[off])
		}
	}
	if logs[0][first] != "v-after" {
		t.Fatalf("offset %d holds %q, want v-after", first, logs[0][first])
	}
	t.Logf("kept %d records; writes resumed at offset %d", len(logs[0])-1, first)
}

// TestDamagedFollowersRebuildWithTheLeaderUp: RF=3, nothing killed. A
// follower's log is corrupted while it is stopped; it restarts and must
// rebuild from the leader as it is (before the fix it never did: the
// leader's record of how far it had got could not be lowered, and the
// chaos suite's disk-faults scenario stalled a partition for 90 s once
// the other follower was damaged too). Then the other follower is damaged
// the same way: writes go on, it rebuilds too, and every acknowledged
// record is on every replica.
func TestDamagedFollowersRebuildWithTheLeaderUp(t *testing.T) {
	tc, c := clusterWithTopic(t, "dmg", 1)
	acked := produceNumbered(t, c, "dmg", 0, 400, 90)
	leader := func() uint64 {
		var l uint64
		checkFor(t, 20*time.Second, "a leader", func() error {
			if l = uint64(leaderOf(t, c, "dmg", 0)); l == 0 {
				return fmt.Errorf("no leader")
			}
			return nil
		})
		return l
	}
	next, prev := 400, uint64(0)
	for round := range 2 {
		l := leader()
		follower := uint64(1)
		for follower == l || follower == prev {
			follower++
		}
		prev = follower
		f := tc.nodes[follower]
		f.Stop(t)
		dirs, _ := filepath.Glob(filepath.Join(f.DataDir(), "replicas", "dmg-0-*"))
		if len(dirs) != 1 {
			t.Fatalf("replica dirs: %v", dirs)
		}
		flipByte(t, walSegments(t, dirs[0])[0], 0.5)
		for off, v := range produceNumbered(t, c, "dmg", next, 200, 90) {
			acked[off] = v
		}
		next += 200
		f.Start(t)
		t.Logf("round %d: node %d (a follower) restarted with a damaged log; node %d leads", round, follower, l)
		checkFor(t, 60*time.Second, "the damaged follower to rebuild and every replica to catch up", func() error {
			if !strings.Contains(f.logs(), "the log is damaged") {
				return fmt.Errorf("the follower has not found the damage yet")
			}
			return rebuiltAndCaughtUp(t, tc, f, "dmg")
		})
		for off, v := range produceNumbered(t, c, "dmg", next, 100, 90) {
			acked[off] = v
		}
		next += 100
	}
	c.Close()
	ackedOnEveryReplica(t, tc, "dmg", acked)
}

// ackedOnEveryReplica stops the three nodes and checks that each replica
// of topic's partition 0 holds every acknowledged record at its offset.
func ackedOnEveryReplica(t *testing.T, tc *testCluster, topic string, acked map[int64]string) {
	t.Helper()
	for _, id := range []uint64{1, 2, 3} {
		tc.nodes[id].Stop(t)
	}
	for _, id := range []uint64{1, 2, 3} {
		got := readReplica(t, tc.nodes[id].DataDir(), topic, 0)
		for off, v := range acked {
			if got[off] != v {
				t.Fatalf("node %d: offset %d holds %q, acknowledged %q", id, off, got[off], v)
			}
		}
	}
	t.Logf("%d acknowledged records on all three replicas", len(acked))
}

// rebuiltAndCaughtUp reports why follower f's replica of topic's
// partition 0 is not rebuilt (its damage record cleared) with every
// replica's high watermark equal yet, or nil.
func rebuiltAndCaughtUp(t *testing.T, tc *testCluster, f *proc, topic string) error {
	if m := metricSum(t, f, "herald_partition_damaged"); m != 0 {
		return fmt.Errorf("follower still damaged")
	}
	hws, err := tc.highWatermarks(t, topic, 0)
	if err != nil {
		return err
	}
	if hws[0] != hws[1] || hws[1] != hws[2] {
		return fmt.Errorf("high watermarks %v", hws)
	}
	return nil
}
