package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Paced syncs on a real broker (--log-sync-pace, default 2ms): a
// producer that waits for each acknowledgement (one entry a sync) is
// never held; many producers' appends at once are
// (herald_log_syncs_paced_total moves). Every record is acknowledged only
// once synced: a SIGKILL right after the load loses none of them.
func TestSyncPaceEndToEnd(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	if _, err := c.CreateTopic(ctx, "paced", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	const paced = "herald_log_syncs_paced_total"
	acked := map[string]ackedRecord{}
	var mu sync.Mutex
	send := func(p *client.Producer, v string) error {
		r, err := p.Send(ctx, &client.Message{Topic: "paced", Partition: 0, Value: []byte(v)})
		if err == nil {
			mu.Lock()
			acked[v] = ackedRecord{r.Partition, r.Offset}
			mu.Unlock()
		}
		return err
	}

	before := metricValue(t, n, paced)
	lone := c.NewProducer(client.WithManualPartitions())
	for i := range 40 {
		if err := send(lone, fmt.Sprintf("lone-%08d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricValue(t, n, paced); got != before {
		t.Fatalf("a lone producer's appends were held: %s went from %v to %v", paced, before, got)
	}

	// 16 producers at once, one record a request each: the syncs carry
	// many entries, and are paced.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := c.NewProducer(client.WithManualPartitions())
			for i := range 150 {
				if err := send(p, fmt.Sprintf("w%02d-%08d", w, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := metricValue(t, n, paced); got <= before {
		t.Fatalf("16 producers at once: no sync held (%s %v)", paced, got)
	}
	c.Close()
	n.Kill(t)
	n.Start(t)
	verifyAcked(t, dial(t, n), "paced", 1, acked)
	if len(acked) != 40+16*150 {
		t.Fatalf("%d records acknowledged, want %d", len(acked), 40+16*150)
	}
}
