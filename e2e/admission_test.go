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
func TestOverloadThrottlesFairly(t *testing.T) {
	n := startProc(t, t.TempDir(), "--max-inflight-produce-bytes=1048576")
	admin := dial(t, n)
	createTopic(t, admin, "heavy", 2)
	createTopic(t, admin, "light", 1)

	value := bytes.Repeat([]byte("h"), 1024)
	var recs []*heraldpb.Record
	for range 250 {
		recs = append(recs, &heraldpb.Record{Value: value})
	}
	batch, err := proto.Marshal(&heraldpb.RecordBatch{Records: recs}) // about 256 KiB
	if err != nil {
		t.Fatal(err)
	}

	const (
		heavyConns = 4
		pipeline   = 16
		runFor     = 4 * time.Second
	)
	stop := make(chan struct{})
	lightDone := steadyProducer(t, n, "light", stop)

	type tally struct {
		ok, throttled int
		err           error
	}
	results := make([]tally, heavyConns)
	var wg sync.WaitGroup
	for i := range heavyConns {
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

	wg.Wait()
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
	t.Logf("heavy raw: %+v; SDK: %d ok, stats %+v; light: %d sent, worst %v", results, sdkOK, sdkStats, sent, worst)
}

// rawFlood keeps pipeline produce frames of batch in flight on nc to
// heavy/part until end, then reads the remaining answers. It counts
// ProduceResponses and THROTTLED errors; anything else (another error, a
// THROTTLED without retry-after, no answer within 30s) ends it with err.
func rawFlood(nc net.Conn, batch []byte, part uint32, pipeline int, end time.Time) (r struct {
	ok, throttled int
	err           error
}) {
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
		case e.GetCode() == heraldpb.ErrorCode_THROTTLED && e.GetRetryAfterMs() > 0 && e.GetRetriable():
			r.throttled++
		default:
			r.err = fmt.Errorf("answer %v, want a ProduceResponse or THROTTLED with a retry-after", f)
			return r
		}
	}
}
