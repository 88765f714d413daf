package client

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// checkSequences checks that the batches b stored (duplicates aside) carry
// one non-zero producer id per partition and sequences that count the
// partition's records from 0, and returns how many batches were duplicates.
func checkSequences(t *testing.T, b *fakebroker.Broker) (dups int) {
	t.Helper()
	next := map[uint32]int64{}
	pid := map[uint32]uint64{}
	for _, pr := range b.Produced() {
		if pr.Duplicate {
			dups++
			continue
		}
		if pr.ProducerID == 0 || !pr.Explicit {
			t.Fatalf("batch without producer id or partition: %+v", pr)
		}
		if id, ok := pid[pr.Partition]; ok && id != pr.ProducerID {
			t.Fatalf("partition %d: producer id %x after %x", pr.Partition, pr.ProducerID, id)
		}
		pid[pr.Partition] = pr.ProducerID
		if pr.BaseSequence != next[pr.Partition] {
			t.Fatalf("partition %d: sequence %d, want %d", pr.Partition, pr.BaseSequence, next[pr.Partition])
		}
		next[pr.Partition] += int64(pr.Count)
	}
	return dups
}

// A batch whose response is lost (the broker wrote it, then the connection
// dropped) is retried with the same producer id and sequence, and stored
// once.
func TestIdempotentRetryOfLostResponse(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var n atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil && n.Add(1)%3 == 1 {
			return fakebroker.Action{LoseReply: true}
		}
		return fakebroker.Action{}
	})
	p := c.NewProducer(WithBatchBytes(100), WithLinger(0), WithRetryBackoff(time.Millisecond, time.Millisecond), WithManualPartitions())
	ctx := testCtx(t)
	const total = 200
	var mu sync.Mutex
	offsets := map[int64]bool{}
	for i := 0; i < total; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Partition: 0, Value: []byte(strconv.Itoa(i))}, func(r Result, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			if offsets[r.Offset] {
				t.Errorf("offset %d acknowledged twice", r.Offset)
			}
			offsets[r.Offset] = true
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	recs := b.Records("t", 0)
	if len(recs) != total {
		t.Fatalf("stored %d records, want %d", len(recs), total)
	}
	for i, r := range recs {
		if string(r.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("record %d is %s", i, r.GetValue())
		}
	}
	if dups := checkSequences(t, b); dups == 0 {
		t.Fatal("no retry was answered as a duplicate: the test lost no response")
	}
	if len(offsets) != total {
		t.Fatalf("%d offsets acknowledged, want %d", len(offsets), total)
	}
}

// With idempotence, records with neither key nor partition are spread by
// the producer over the partitions, a batch at a time, each partition with
// its own sequences.
func TestIdempotentSpreadsUnkeyedRecords(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	p := c.NewProducer(WithBatchBytes(64), WithLinger(time.Millisecond))
	ctx := testCtx(t)
	for i := 0; i < 400; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Value: []byte(fmt.Sprintf("%04d", i))}, func(_ Result, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkSequences(t, b)
	total := 0
	for part := uint32(0); part < 4; part++ {
		recs := b.Records("t", part)
		if len(recs) < 40 {
			t.Errorf("partition %d got %d of 400 records", part, len(recs))
		}
		total += len(recs)
	}
	if total != 400 {
		t.Fatalf("stored %d records, want 400", total)
	}
}

// OUT_OF_ORDER_SEQUENCE fails the batch's records with the typed error, at
// once; the partition's next batch starts a new producer id at sequence 0.
func TestIdempotentOutOfOrderFailsTyped(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var attempts atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil && attempts.Add(1) == 2 {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "gap")}
		}
		return fakebroker.Action{}
	})
	p := c.NewProducer(WithRetryBackoff(time.Millisecond, time.Millisecond), WithManualPartitions())
	ctx := testCtx(t)
	if _, err := p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("b")})
	if !IsCode(err, heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE) || IsRetryable(err) || attempts.Load() != 2 {
		t.Fatalf("err = %v after %d attempts; want one attempt failing with OUT_OF_ORDER_SEQUENCE", err, attempts.Load())
	}
	if _, err := p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	prs := b.Produced()
	if len(prs) != 2 || prs[0].ProducerID == prs[1].ProducerID || prs[1].BaseSequence != 0 || prs[1].ProducerID == 0 {
		t.Fatalf("batches %+v; want the batch after the failure under a new producer id at sequence 0", prs)
	}
}

// With up to 5 batches in flight per partition, a batch refused as out of
// order because an earlier one is being retried is sent again after it:
// every record is stored once, in order.
func TestIdempotentPipelinedRetriesKeepOrder(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var n atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() == nil {
			return fakebroker.Action{}
		}
		if n.Add(1)%7 == 3 {
			return fakebroker.Action{Delay: 5 * time.Millisecond, Error: heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "moved")}
		}
		return fakebroker.Action{}
	})
	p := c.NewProducer(WithPartitionInFlight(10), WithBatchBytes(60), WithLinger(0), WithRetryBackoff(time.Millisecond, 2*time.Millisecond), WithManualPartitions())
	ctx := testCtx(t)
	const total = 400
	for i := 0; i < total; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Partition: 0, Value: []byte(fmt.Sprintf("%04d", i))}, func(_ Result, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	recs := b.Records("t", 0)
	if len(recs) != total {
		t.Fatalf("stored %d records, want %d", len(recs), total)
	}
	for i, r := range recs {
		if want := fmt.Sprintf("%04d", i); string(r.GetValue()) != want {
			t.Fatalf("record %d is %s, want %s", i, r.GetValue(), want)
		}
	}
	checkSequences(t, b)
	if b.MaxInFlightSeen() < 2 {
		t.Fatalf("at most %d requests in flight: the test needs pipelined batches", b.MaxInFlightSeen())
	}
}

// WithIdempotence(false) sends no producer id, and leaves the partition of
// records without key to the broker; with WithManualPartitions too, the
// record goes to its partition, still without producer id.
func TestIdempotenceOff(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 3))
	c := dial(t, b)
	ctx := testCtx(t)
	if _, err := c.NewProducer(WithIdempotence(false)).Send(ctx, &Message{Topic: "t", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewProducer(WithIdempotence(false), WithManualPartitions()).Send(ctx, &Message{Topic: "t", Partition: 2, Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	prs := b.Produced()
	if len(prs) != 2 || prs[0].Explicit || prs[0].ProducerID != 0 || !prs[1].Explicit || prs[1].Partition != 2 || prs[1].ProducerID != 0 {
		t.Fatalf("batches %+v; want no producer id, and no partition for the record without key", prs)
	}
}
