package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// TestOverloadThrottlesFairly is issue 14 §4 against a real broker
// process with a small admission limit (1 MiB): four raw connections
// keep 16 produce frames of 256 KiB each in flight on one topic, and two
// SDK producers flood it too, while a light SDK producer sends a small
// record every 20ms to another topic. The heavy connections get THROTTLED
// with a retry-after and nothing else (no timeout, no other error); the
// SDK producers retry their THROTTLED batches and fail none; every light
// record succeeds.
//
// It runs with --max-produce-defer=0, so that admission answers at once;
// TestOverloadDefersInOrder covers the default, where a produce first
// waits for its connection's turn.
func TestOverloadThrottlesFairly(t *testing.T) {
	n := startProc(t, t.TempDir(), "--max-inflight-produce-bytes=1048576", "--max-produce-defer=0")
	admin := dial(t, n)
	createTopic(t, admin, "heavy", 2)
	createTopic(t, admin, "light", 1)

	value := bytes.Repeat([]byte("h"), 1024)
	batch := heavyBatch(t)

	const (
		heavyConns = 4
		pipeline   = 16
		runFor     = 4 * time.Second
	)
	stop := make(chan struct{})
	lightDone := steadyProducer(t, n, "light", stop)

	wait := floodFrom(t, n, heavyConns, batch, pipeline, runFor)

	// Two SDK producers flood too: they must see THROTTLED as retries,
	// never as failures.
	var sdkWG sync.WaitGroup
	var sdkMu sync.Mutex
	var sdkErrs []error
	var sdkOK int
	var sdkStats []client.ProducerStats
	for range 2 {
		p := dial(t, n).NewProducer()
		sdkWG.Add(1)
		go func() {
			defer sdkWG.Done()
			end := time.Now().Add(runFor)
			for time.Now().Before(end) {
				p.SendAsync(context.Background(), &client.Message{Topic: "heavy", Value: value}, func(_ client.Result, err error) {
					sdkMu.Lock()
					defer sdkMu.Unlock()
					if err != nil {
						sdkErrs = append(sdkErrs, err)
					} else {
						sdkOK++
					}
				})
			}
			if err := p.Close(ctxT(t, 60*time.Second)); err != nil {
				sdkMu.Lock()
				sdkErrs = append(sdkErrs, fmt.Errorf("close: %w", err))
				sdkMu.Unlock()
			}
			sdkMu.Lock()
			sdkStats = append(sdkStats, p.Stats())
			sdkMu.Unlock()
		}()
	}

	results := wait()
	sdkWG.Wait()
	close(stop)
	worst, sent, lightErrs := lightDone()

	throttled := 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("heavy connection %d: %v", i, r.err)
		}
		if r.ok == 0 {
			t.Errorf("heavy connection %d: no produce admitted in %v (%d THROTTLED)", i, runFor, r.throttled)
		}
		throttled += r.throttled
	}
	if throttled == 0 {
		t.Errorf("no heavy produce was THROTTLED: %+v", results)
	}
	if len(sdkErrs) > 0 {
		t.Errorf("SDK producers: %d records failed, first: %v", len(sdkErrs), sdkErrs[0])
	}
	if len(lightErrs) > 0 {
		t.Errorf("light producer: %d of %d sends failed, first: %v", len(lightErrs), sent+len(lightErrs), lightErrs[0])
	}
	if sent == 0 {
		t.Errorf("light producer sent nothing")
	}
	t.Logf("heavy raw: %d THROTTLED, written per connection %v; SDK: %d ok, stats %+v; light: %d sent, worst %v", throttled, writtenPer(results), sdkOK, sdkStats, sent, worst)
}

// TestOverloadDefersInOrder: with the default --max-produce-defer (1 s),
// a produce over its connection's fair share is not refused but left
// unread until the connection's turn. Four raw connections pipelining 16
// frames of 256 KiB against a 1 MiB limit (a share is a fifth of it,
// smaller than one frame) get nearly every frame written, in the order
// sent, with no error; the broker counts the waits
// (herald_produce_deferred_total); a light producer on another topic
// fails nothing.
func TestOverloadDefersInOrder(t *testing.T) {
	n := startProc(t, t.TempDir(), "--max-inflight-produce-bytes=1048576")
	admin := dial(t, n)
	createTopic(t, admin, "heavy", 2)
	createTopic(t, admin, "light", 1)
	batch := heavyBatch(t)
	deferredBefore := metricSum(t, n, "herald_produce_deferred_total")

	const heavyConns, pipeline, runFor = 4, 16, 3 * time.Second
	stop := make(chan struct{})
	lightDone := steadyProducer(t, n, "light", stop)
	wait := floodFrom(t, n, heavyConns, batch, pipeline, runFor)
	results := wait()
	close(stop)
	_, sent, lightErrs := lightDone()

	ok, throttled := 0, 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("heavy connection %d: %v", i, r.err)
		}
		if r.ok == 0 {
			t.Errorf("heavy connection %d: no produce written in %v", i, runFor)
		}
		for j := 1; j < len(r.bases); j++ {
			if r.bases[j] <= r.bases[j-1] {
				t.Errorf("heavy connection %d: batch %d written at offset %d, after batch %d at %d: out of the order sent", i, j, r.bases[j], j-1, r.bases[j-1])
				break
			}
		}
		ok += r.ok
		throttled += r.throttled
	}
	// A frame is refused only after waiting a whole second for its turn;
	// with four connections taking turns that should be rare.
	if throttled*10 > ok {
		t.Errorf("%d frames THROTTLED against %d written: the waits did not let them in", throttled, ok)
	}
	if d := metricSum(t, n, "herald_produce_deferred_total") - deferredBefore; d == 0 {
		t.Errorf("herald_produce_deferred_total did not move: no produce waited for its turn")
	}
	if len(lightErrs) > 0 {
		t.Errorf("light producer: %d of %d sends failed, first: %v", len(lightErrs), sent+len(lightErrs), lightErrs[0])
	}
	if sent == 0 {
		t.Errorf("light producer sent nothing")
	}
	t.Logf("heavy: %d written, %d THROTTLED; light: %d sent", ok, throttled, sent)
}

func writtenPer(rs []floodResult) []int {
	var n []int
	for _, r := range rs {
		n = append(n, r.ok)
	}
	return n
}

// floodFrom runs rawFlood on conns raw connections to n (connection i to
// partition i%2 of "heavy") for runFor; the function it returns waits for
// them and gives their results.
func floodFrom(t *testing.T, n node, conns int, batch []byte, pipeline int, runFor time.Duration) func() []floodResult {
	results := make([]floodResult, conns)
	var wg sync.WaitGroup
	for i := range conns {
		nc, err := net.Dial("tcp", n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = rawFlood(nc, batch, uint32(i%2), pipeline, time.Now().Add(runFor))
		}()
	}
	return func() []floodResult {
		wg.Wait()
		return results
	}
}

// heavyBatch is an encoded RecordBatch of 250 records of 1 KiB (about
// 256 KiB).
func heavyBatch(t *testing.T) []byte {
	value := bytes.Repeat([]byte("h"), 1024)
	var recs []*heraldpb.Record
	for range 250 {
		recs = append(recs, &heraldpb.Record{Value: value})
	}
	batch, err := proto.Marshal(&heraldpb.RecordBatch{Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	return batch
}

// floodResult is what rawFlood saw: answers by kind, the base offsets of
// the batches written in the order their frames were sent, and the error
// that ended it, if any.
type floodResult struct {
	ok, throttled int
	bases         []int64
	err           error
}

// rawFlood keeps pipeline produce frames of batch in flight on nc to
// heavy/part until end, then reads the remaining answers. It counts
// ProduceResponses and THROTTLED errors; anything else (another error, a
// THROTTLED without retry-after, no answer within 30s) ends it with err.
func rawFlood(nc net.Conn, batch []byte, part uint32, pipeline int, end time.Time) (r floodResult) {
	br := bufio.NewReaderSize(nc, 64<<10)
	send := func(f *heraldpb.Frame) error {
		raw, err := heraldpb.AppendFrame(nil, f)
		if err != nil {
			return err
		}
		_, err = nc.Write(raw)
		return err
	}
	read := func() (*heraldpb.Frame, error) {
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		var hdr [4]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return nil, fmt.Errorf("reading an answer: %w", err)
		}
		buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(br, buf); err != nil {
			return nil, fmt.Errorf("reading an answer: %w", err)
		}
		return heraldpb.DecodeFrame(buf)
	}
	if err := send(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}}); err != nil {
		r.err = err
		return r
	}
	if f, err := read(); err != nil || f.GetHelloResponse() == nil {
		r.err = fmt.Errorf("hello: %v %v", f, err)
		return r
	}
	produce := &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "heavy", Partition: &part, Records: batch}}
	id, outstanding := uint64(1), 0
	for {
		for outstanding < pipeline && time.Now().Before(end) {
			id++
			if r.err = send(&heraldpb.Frame{Id: id, Body: produce}); r.err != nil {
				return r
			}
			outstanding++
		}
		if outstanding == 0 {
			return r
		}
		f, err := read()
		if err != nil {
			r.err = err
			return r
		}
		outstanding--
		switch e := f.GetError(); {
		case f.GetProduceResponse() != nil:
			r.ok++
			r.bases = append(r.bases, f.GetProduceResponse().GetBaseOffset())
		case e.GetCode() == heraldpb.ErrorCode_THROTTLED && e.GetRetryAfterMs() > 0 && e.GetRetriable():
			r.throttled++
		default:
			r.err = fmt.Errorf("answer %v, want a ProduceResponse or THROTTLED with a retry-after", f)
			return r
		}
	}
}

// TestOverloadWaitersTakeTurns: connections whose produce waits for room
// with nothing of their own in flight wait in one line, and the bytes any
// answer frees go to the next in line. Before the line, such a connection
// waited for its own retry-after timer however much room was freed, while
// connections whose own answers woke them took the room again; and a
// frame the loop had found room for could be refused THROTTLED when
// another event loop took the room before it was counted. Twelve
// connections each pipeline 256 KiB batches against a 384 KiB limit, room
// for one batch (the latency control off, so that the limit stays put):
// every connection writes its fair part, none waits the second after
// which a frame is THROTTLED, and the line is seen. (With a 1 MiB limit,
// four batches, a CI machine busy with other suites once sent too slowly
// for four to be in flight together, and nobody waited.)
func TestOverloadWaitersTakeTurns(t *testing.T) {
	n := startProc(t, t.TempDir(), "--max-inflight-produce-bytes=393216", "--produce-latency-target=0")
	admin := dial(t, n)
	createTopic(t, admin, "heavy", 2)
	batch := heavyBatch(t)

	const conns, pipeline, runFor = 12, 4, 3 * time.Second
	maxWaiting := watchMax(t, n, "herald_produce_waiting_connections", runFor)
	results := floodFrom(t, n, conns, batch, pipeline, runFor)()

	least, most, throttled := -1, 0, 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("connection %d: %v", i, r.err)
		}
		if least < 0 || r.ok < least {
			least = r.ok
		}
		most = max(most, r.ok)
		throttled += r.throttled
	}
	if throttled > 0 {
		t.Errorf("%d frames THROTTLED: a connection waited over a second for its turn, or lost a turn it was given", throttled)
	}
	if least*3 < most {
		t.Errorf("writes per connection from %d to %d: the turns were not fair", least, most)
	}
	if maxWaiting() == 0 {
		t.Errorf("herald_produce_waiting_connections stayed 0: no connection waited in line")
	}
	t.Logf("writes per connection %d..%d, THROTTLED %d, at most %d in line", least, most, throttled, maxWaiting())
}

// TestLatencyControlFollowsSparseProduces drives the latency control of a
// real broker. With a 1 µs target every sparse produce (the light
// producer's) is over it, so the admission limit in force falls to its
// floor (16 MiB / 64 = 256 KiB), and heavy connections flooding meanwhile
// are held near it, waiting their turns without an error. Once only heavy
// produces (never sparse) are answered, the limit climbs back to the
// configured 16 MiB.
func TestLatencyControlFollowsSparseProduces(t *testing.T) {
	const maxLimit, floor = 16 << 20, 256 << 10
	n := startProc(t, t.TempDir(), fmt.Sprintf("--max-inflight-produce-bytes=%d", maxLimit), "--produce-latency-target=1us")
	admin := dial(t, n)
	createTopic(t, admin, "heavy", 2)
	createTopic(t, admin, "light", 1)
	batch := heavyBatch(t)
	limit := func() int64 { return int64(metricSum(t, n, "herald_produce_limit_bytes")) }
	if got := limit(); got != maxLimit {
		t.Fatalf("limit in force %d at start, want %d", got, maxLimit)
	}

	stop := make(chan struct{})
	lightDone := steadyProducer(t, n, "light", stop)
	deadline := time.Now().Add(15 * time.Second)
	for limit() != floor {
		if time.Now().After(deadline) {
			t.Fatalf("limit in force %d after 15 s of slow sparse produces, want the floor %d", limit(), floor)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if metricSum(t, n, "herald_produce_limit_cuts_total") == 0 {
		t.Error("herald_produce_limit_cuts_total is 0 with the limit cut")
	}
	const runFor = 2 * time.Second
	most := watchMax(t, n, "herald_produce_inflight_bytes", runFor)
	for i, r := range floodFrom(t, n, 4, batch, 8, runFor)() {
		if r.err != nil || r.ok == 0 {
			t.Errorf("heavy connection %d under the lowered limit: %d written, error %v", i, r.ok, r.err)
		}
	}
	close(stop)
	if _, sent, errs := lightDone(); len(errs) > 0 || sent == 0 {
		t.Errorf("light producer: %d sent, errors %v", sent, errs)
	}
	// Each 256 KiB frame is admitted only in its turn, when it fits the
	// 256 KiB limit or nothing is in flight: a few frames at most, where
	// 16 MiB were let in before the cut.
	if m := most(); m > 4*int64(len(batch))+4<<10 {
		t.Errorf("%d produce bytes in flight under a %d limit", m, floor)
	}

	// Heavy produces only: the limit climbs back.
	deadline = time.Now().Add(15 * time.Second)
	for limit() != maxLimit {
		if time.Now().After(deadline) {
			t.Fatalf("limit in force %d after 15 s without sparse produces, want %d", limit(), maxLimit)
		}
		floodFrom(t, n, 1, batch, 2, 200*time.Millisecond)()
	}
	t.Logf("at most %d bytes in flight at the floor", most())
}

// watchMax samples metric every 10 ms for d from now, and returns a
// function that waits for the end and gives the largest value seen.
func watchMax(t *testing.T, n node, metric string, d time.Duration) func() int64 {
	var most atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if v := int64(metricSum(t, n, metric)); v > most.Load() {
				most.Store(v)
			}
		}
	}()
	return func() int64 {
		<-done
		return most.Load()
	}
}

// TestParkedCommitFreesItsAdmission: a transaction's commit batch that
// arrives before the commit it names (txn_commit_after) waits at the
// partition, written. Its bytes stop counting against its connection's
// fair share then (ProduceDrained), so the commit it waits for, sent next
// on the same connection, is admitted and both commit at once. Before,
// the waiting one kept its bytes admitted: with a limit under two such
// batches, the one it waited for was THROTTLED again and again until the
// partition gave up on the waiting one (10 s), and the producer stalled.
func TestParkedCommitFreesItsAdmission(t *testing.T) {
	n := startProc(t, t.TempDir(), "--max-inflight-produce-bytes=12288", "--max-produce-defer=100ms")
	admin := dial(t, n)
	createTopic(t, admin, "parked", 1)
	tc := dialTxn(t, n)
	init := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "parked-1", OnePhase: true}}}).GetInitProducerIdResponse()
	if init == nil || init.OnePhaseEpochs < 2 {
		t.Fatalf("InitProducerId: %v", init)
	}
	part, value := uint32(0), bytes.Repeat([]byte("p"), 8000) // a frame is over half the limit
	commitBatch := func(epoch uint32, after *uint32) *heraldpb.Frame {
		tc.next++
		return &heraldpb.Frame{Id: tc.next, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "parked", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, Records: oneRecord(string(value)),
			TxnBatch: true, TransactionalId: "parked-1", ProducerId: init.ProducerId, ProducerEpoch: epoch,
			CommitTxn: true, TxnCommitAfter: after}}}
	}
	first := init.ProducerEpoch
	later := commitBatch(first+1, &first)
	tc.send(later)
	deadline := time.Now().Add(10 * time.Second)
	for metricSum(t, n, "herald_partition_txn_commits_waiting") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the later commit never waited at the partition")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	earlier := commitBatch(first, nil)
	tc.send(earlier)
	answered := map[uint64]*heraldpb.ProduceResponse{}
	throttled := 0
	for len(answered) < 2 {
		f := tc.read()
		if f == nil {
			t.Fatal("connection closed")
		}
		switch {
		case f.Id != earlier.Id && f.Id != later.Id:
		case f.GetProduceResponse() != nil:
			answered[f.Id] = f.GetProduceResponse()
		case f.GetError().GetCode() == heraldpb.ErrorCode_THROTTLED && f.Id == earlier.Id:
			// What a client does: send it again (same epoch and sequence).
			throttled++
			tc.send(earlier)
		default:
			t.Fatalf("frame %d answered %v", f.Id, f)
		}
	}
	took := time.Since(start)
	if a, b := answered[earlier.Id].GetBaseOffset(), answered[later.Id].GetBaseOffset(); a < 0 || b <= a {
		t.Fatalf("the earlier transaction committed at %d, the later at %d: not in their order", a, b)
	}
	if throttled > 0 || took > 5*time.Second {
		t.Fatalf("the earlier commit was THROTTLED %d times, and both took %v: the waiting commit held its connection's share", throttled, took)
	}
	if metricSum(t, n, "herald_produce_drained_total") < 1 {
		t.Fatal("herald_produce_drained_total did not count the waiting commit")
	}
}

// TestPipelinedTransactionsAreNotSparse: a producer with many small
// transactions in flight (CommitAsync, 32 at a time, 10 KiB each) is a
// heavy producer, though a sync answers the commits it carried all at
// once and leaves its connection with almost nothing in flight right
// after. The latency control took its next commit for a light producer's
// (sparse), and with a 1 µs target every such sample cut the admission
// limit: the producer's own load throttled it, thousands of samples a
// second. A produce is sparse only on a connection that stayed light for
// two latency windows, so past the producer's first requests none is.
func TestPipelinedTransactionsAreNotSparse(t *testing.T) {
	n := startProc(t, t.TempDir(), "--produce-latency-target=1us")
	c := dial(t, n)
	createTopic(t, c, "tx", 2)
	ctx := ctxT(t, 60*time.Second)
	p := newTxnProducer(t, c, "pipelined", client.WithTxnWrittenOnce())
	var failed atomic.Int64
	var committed atomic.Int64
	val := bytes.Repeat([]byte("x"), 1024)
	run := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			if err := p.Begin(); err != nil {
				t.Fatal(err)
			}
			for range 10 {
				p.SendAsync(ctx, &client.Message{Topic: "tx", Value: val}, nil)
			}
			err := p.CommitAsync(ctx, func(_ client.TxnEnd, err error) {
				if err != nil {
					failed.Add(1)
				} else {
					committed.Add(1)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	sparse := func() float64 { return metricSum(t, n, "herald_produce_sparse_latency_seconds_count") }
	run(time.Second) // (its first requests, before 64 KiB are in flight, are sparse)
	before, cutsBefore := sparse(), metricSum(t, n, "herald_produce_limit_cuts_total")
	run(2 * time.Second)
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	after, cuts := sparse()-before, metricSum(t, n, "herald_produce_limit_cuts_total")-cutsBefore
	if failed.Load() > 0 || committed.Load() == 0 {
		t.Fatalf("%d transactions committed, %d failed", committed.Load(), failed.Load())
	}
	// (Close drains the last commits: the last may be sparse.)
	if after > 4 || cuts > 4 {
		t.Errorf("%v of the pipelining producer's produces taken for sparse in 2 s, %v limit cuts", after, cuts)
	}
	t.Logf("%d transactions committed; %v sparse produces and %v cuts after the first second", committed.Load(), after, cuts)
}
