package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// mountTmpfs mounts a size-limited tmpfs at a new temp dir, or skips the
// test where that is not allowed (not root, no mount).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs for a real ENOSPC")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs (%v: %s); skipping the real disk-full test", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// TestDiskFull runs a broker subprocess on a small tmpfs, fills it, and
// checks: producers get STORAGE_ERROR (retriable), the broker stays up and
// keeps answering, and once space is freed producing works again with every
// acknowledged record intact.
func TestDiskFull(t *testing.T) {
	filler, c, ctx := fullDiskBroker(t, 120*time.Second)
	p := c.NewProducer(client.WithMaxRetries(0), client.WithManualPartitions())
	acked := map[string]ackedRecord{}
	val := strings.Repeat("z", 60<<10)
	var storageErr *client.Error
	for i := 0; i < 2000 && storageErr == nil; i++ {
		v := fmt.Sprintf("w0-%08d", i)
		r, err := p.Send(ctx, &client.Message{Topic: "full", Partition: 0, Value: []byte(v + val)})
		switch {
		case err == nil:
			acked[v] = ackedRecord{r.Partition, r.Offset}
		case errors.As(err, &storageErr) && storageErr.Code == heraldpb.ErrorCode_STORAGE_ERROR:
		default:
			t.Fatalf("produce %d: unexpected error %v", i, err)
		}
	}
	if storageErr == nil {
		t.Fatal("filled past the tmpfs size without a STORAGE_ERROR")
	}
	if !client.IsRetryable(storageErr) || !strings.Contains(storageErr.Message, "disk full") {
		t.Fatalf("disk-full error is not a clear retriable error: %v", storageErr)
	}
	t.Logf("disk full after %d acknowledged records: %v", len(acked), storageErr)
	// The broker is still up: admin requests work.
	if _, err := c.ListTopics(ctx); err != nil {
		t.Fatalf("broker not answering while the disk is full: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// After space is freed the partition reopens its log and accepts writes.
	checkFor(t, 60*time.Second, "produce to succeed after freeing space", func() error {
		r, err := p.Send(ctx, &client.Message{Topic: "full", Partition: 0, Value: []byte("w1-00000000")})
		if err == nil {
			acked["w1-00000000"] = ackedRecord{r.Partition, r.Offset}
		}
		return err
	})
	verifyAcked(t, c, "full", 1, withoutPadding(acked))
}

// withoutPadding keys acked records by the stored value, which for the
// disk-full test is the id followed by padding; verifyAcked compares full
// values, so it gets them back with the same padding.
func withoutPadding(acked map[string]ackedRecord) map[string]ackedRecord {
	out := map[string]ackedRecord{}
	pad := strings.Repeat("z", 60<<10)
	for v, a := range acked {
		if strings.HasPrefix(v, "w0-") {
			out[v+pad] = a
		} else {
			out[v] = a
		}
	}
	return out
}

// TestDiskFullOutcomeUnknown is issue 14 §7's "after a disk-full error, 150
// records the client was told failed were stored": several producers keep
// batches in flight while the disk fills, and go on sending while the
// partition fails and reopens. Afterwards, every record that was reported
// failed and is stored must have been reported with
// client.IsOutcomeUnknown(err); a failure without it must mean the record
// is not stored. Acknowledged records are all stored where acknowledged.
// (Measured: 30-130 of about 400 failed records were stored, all reported
// outcome unknown; with failPending's OutcomeUnknown removed it fails.)
func TestDiskFullOutcomeUnknown(t *testing.T) {
	filler, c, ctx := fullDiskBroker(t, 180*time.Second)
	const writers, failuresEach = 12, 8
	val := strings.Repeat("z", 8<<10)
	var (
		mu     sync.Mutex
		acked  = map[string]ackedRecord{}
		failed = map[string]error{}
	)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		// Half the writers idempotent (the default), half not; each keeps
		// up to 32 records in flight (SendAsync), batched.
		p := c.NewProducer(client.WithMaxRetries(0), client.WithIdempotence(w%2 == 0), client.WithLinger(time.Millisecond), client.WithManualPartitions())
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem := make(chan struct{}, 32)
			var fails atomic.Int32
			for i := 0; i < 3000 && fails.Load() < failuresEach && ctx.Err() == nil; i++ {
				sem <- struct{}{}
				v := fmt.Sprintf("w%d-%08d", w, i)
				p.SendAsync(ctx, &client.Message{Topic: "full", Partition: 0, Value: []byte(v + val)}, func(r client.Result, err error) {
					defer func() { <-sem }()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failed[v+val] = err
						fails.Add(1)
						return
					}
					acked[v+val] = ackedRecord{r.Partition, r.Offset}
				})
			}
			if err := p.Flush(ctx); err != nil {
				t.Errorf("flush: %v", err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	nAcked, nFailed := len(acked), len(failed)
	var storageErrs, unknown int
	for _, err := range failed {
		if client.IsCode(err, heraldpb.ErrorCode_STORAGE_ERROR) {
			storageErrs++
		}
		if client.IsOutcomeUnknown(err) {
			unknown++
		}
	}
	mu.Unlock()
	t.Logf("%d records acknowledged, %d failed (%d STORAGE_ERROR, %d outcome unknown)", nAcked, nFailed, storageErrs, unknown)
	if storageErrs == 0 {
		t.Fatal("filled the disk without a STORAGE_ERROR")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p := c.NewProducer(client.WithManualPartitions())
	checkFor(t, 60*time.Second, "produce to succeed after freeing space", func() error {
		r, err := p.Send(ctx, &client.Message{Topic: "full", Partition: 0, Value: []byte("after-00000000")})
		if err == nil {
			mu.Lock()
			acked["after-00000000"] = ackedRecord{r.Partition, r.Offset}
			mu.Unlock()
		}
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	verifyAcked(t, c, "full", 1, acked)
	var storedUnknown int
	var wrong []string
	for _, m := range readPartition(t, c, "full", 0) {
		err, ok := failed[string(m.Value)]
		if !ok {
			continue
		}
		if client.IsOutcomeUnknown(err) {
			storedUnknown++
			continue
		}
		wrong = append(wrong, fmt.Sprintf("%s at %d: %v", m.Value[:11], m.Offset, err))
	}
	t.Logf("of the failed records, %d outcome-unknown ones were stored", storedUnknown)
	if storedUnknown == 0 {
		// Seen in none of 5 runs, but possible: then no failed record was
		// stored and the check below holds trivially.
		t.Log("no failed record was stored in this run: the outcome-unknown case was not exercised")
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		t.Fatalf("%d records reported failed without outcome unknown were stored, e.g. %v", len(wrong), wrong[:min(5, len(wrong))])
	}
}

// fullDiskBroker starts a broker process whose data dir is on a 24 MiB
// tmpfs already holding an 8 MiB filler file (returned, to free space
// later), with 1 MiB segments and a one-partition topic "full".
func fullDiskBroker(t *testing.T, d time.Duration) (string, *client.Client, context.Context) {
	t.Helper()
	fs := mountTmpfs(t, "24m")
	filler := filepath.Join(fs, "filler")
	if err := os.WriteFile(filler, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startProc(t, filepath.Join(fs, "data"), "--segment-bytes=1048576")
	c := dial(t, n, client.WithRequestTimeout(10*time.Second))
	ctx := ctxT(t, d)
	if _, err := c.CreateTopic(ctx, "full", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	return filler, c, ctx
}
