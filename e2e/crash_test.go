package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

type ackedRecord struct {
	part int32
	off  int64
}

// loadUntilKilled produces from several goroutines with acks=all until at
// least minAcked records are acknowledged, then SIGKILLs the broker. Values
// are "w<writer>-r<round>-<seq>", unique across rounds and increasing per
// writer. It returns the acknowledged records by value.
func loadUntilKilled(t *testing.T, n *proc, topic string, round, minAcked int) map[string]ackedRecord {
	t.Helper()
	var mu sync.Mutex
	acked := map[string]ackedRecord{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c, err := client.Dial(ctx, n.Addr(), client.WithRequestTimeout(5*time.Second))
			if err != nil {
				return
			}
			defer c.Close()
			p := c.NewProducer(client.WithLinger(time.Millisecond), client.WithMaxRetries(0))
			for i := 0; ctx.Err() == nil; i++ {
				v := fmt.Sprintf("w%d-r%03d-%08d", w, round, i)
				p.SendAsync(ctx, &client.Message{Topic: topic, Key: []byte(fmt.Sprintf("w%d", w)), Value: []byte(v)},
					func(r client.Result, err error) {
						if err == nil {
							mu.Lock()
							acked[v] = ackedRecord{r.Partition, r.Offset}
							mu.Unlock()
						}
					})
			}
			closeCtx, cc := context.WithTimeout(context.Background(), 5*time.Second)
			p.Close(closeCtx)
			cc()
		}(w)
	}
	checkFor(t, 60*time.Second, fmt.Sprintf("%d acknowledged records", minAcked), func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acked) < minAcked {
			return fmt.Errorf("%d acknowledged", len(acked))
		}
		return nil
	})
	n.Kill(t) // SIGKILL mid-load: no shutdown path runs
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	out := make(map[string]ackedRecord, len(acked))
	for k, v := range acked {
		out[k] = v
	}
	return out
}

// verifyAcked reads the whole topic and checks every acknowledged record is
// at the partition and offset it was acknowledged with, that offsets are
// dense, that no record is stored twice, and that each writer's records
// are in the order it sent them (values of one writer sort in send order;
// the writer is the part before the first '-').
func verifyAcked(t *testing.T, c *client.Client, topic string, parts int32, acked map[string]ackedRecord) {
	t.Helper()
	found := map[string]ackedRecord{}
	for part := int32(0); part < parts; part++ {
		last := map[string]string{}
		for _, m := range readPartition(t, c, topic, part) {
			v := string(m.Value)
			if _, dup := found[v]; dup {
				t.Fatalf("%s stored twice", v)
			}
			found[v] = ackedRecord{part, m.Offset}
			w, _, _ := strings.Cut(v, "-")
			if prev, ok := last[w]; ok && v <= prev {
				t.Fatalf("partition %d: %s stored after %s", part, v, prev)
			}
			last[w] = v
		}
	}
	var lost []string
	for v, a := range acked {
		f, ok := found[v]
		if !ok {
			lost = append(lost, v)
			continue
		}
		if f != a {
			t.Fatalf("%s acknowledged at %d@%d, stored at %d@%d", v, a.part, a.off, f.part, f.off)
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		t.Fatalf("%d acknowledged records lost, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
}

// TestKillMidLoad SIGKILLs the broker process while producers write with
// acks=all, restarts it, and checks nothing acknowledged was lost or moved;
// twice, so recovery of a recovered log is covered too.
func TestKillMidLoad(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "crash", &heraldpb.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	all := map[string]ackedRecord{}
	for round := 0; round < 2; round++ {
		for v, a := range loadUntilKilled(t, n, "crash", round, 2000) {
			all[v] = a
		}
		n.Start(t)
		c := dial(t, n)
		verifyAcked(t, c, "crash", 2, all)
		t.Logf("round %d: %d acknowledged records all present", round, len(all))
	}
}

// TestTornTailRecovery stops the broker, tears the tail of a partition's
// last WAL segment as a crash mid-write would, and restarts: the broker
// cuts the torn entry, keeps every whole one, and goes on producing.
func TestTornTailRecovery(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 30*time.Second)
		if _, err := c.CreateTopic(ctx, "torn", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		p := c.NewProducer(client.WithManualPartitions())
		acked := map[string]ackedRecord{}
		for i := 0; i < 100; i++ {
			v := fmt.Sprintf("w0-%08d", i)
			r, err := p.Send(ctx, &client.Message{Topic: "torn", Partition: 0, Value: []byte(v)})
			if err != nil {
				t.Fatal(err)
			}
			acked[v] = ackedRecord{r.Partition, r.Offset}
		}
		c.Close()
		n.Stop(t)
		seg := lastSegment(t, filepath.Join(n.DataDir(), "topics", "torn-0"))
		// A partial entry: a length prefix promising 200 bytes, and 37 of them.
		f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		torn := append([]byte{0xc8, 0x01}, make([]byte, 37)...)
		if _, err := f.Write(torn); err != nil {
			t.Fatal(err)
		}
		f.Close()
		n.Start(t)
		c = dial(t, n)
		verifyAcked(t, c, "torn", 1, acked)
		r, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "torn", Partition: 0, Value: []byte("w0-99999999")})
		if err != nil {
			t.Fatalf("produce after torn-tail recovery: %v", err)
		}
		if r.Offset != 100 {
			t.Fatalf("offset after recovery %d, want 100", r.Offset)
		}
	})
}

// lastSegment finds the newest WAL segment file under dir.
func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	var segs []string
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && filepath.Base(filepath.Dir(path)) == "wal" && len(info.Name()) == 20 {
			segs = append(segs, path)
		}
		return nil
	})
	if len(segs) == 0 {
		t.Fatalf("no WAL segments under %s", dir)
	}
	sort.Strings(segs)
	return segs[len(segs)-1]
}
