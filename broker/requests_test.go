package broker

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Requests with fields no handler accepts are refused with
// INVALID_REQUEST, and a fetch's wait is capped (issue 14, section 7).
func TestRequestFieldChecks(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	recs, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("v")}}})

	t.Run("producer_epoch without a transaction", func(t *testing.T) {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), ProducerId: 5, ProducerEpoch: 2, Records: recs}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST || !strings.Contains(e.GetMessage(), "producer_epoch 2") {
			t.Fatalf("producer_epoch 2 on a plain produce: %v", r)
		}
	})
	t.Run("acks", func(t *testing.T) {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Acks: 7, Records: recs}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST || !strings.Contains(e.GetMessage(), "acks 7") {
			t.Fatalf("acks=7: %v", r)
		}
		// Delayed produces go to the scheduler: checked the same.
		r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Acks: 3, DelayMs: 1000, Records: recs}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
			t.Fatalf("delayed acks=3: %v", r)
		}
		for _, a := range []heraldpb.Acks{heraldpb.Acks_ACKS_ALL, heraldpb.Acks_ACKS_LEADER, heraldpb.Acks_ACKS_NONE} {
			checkFor(t, func() error {
				r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Acks: a, Records: recs}}})
				if e := r.GetError(); e != nil {
					if !e.Retriable {
						t.Fatalf("acks %v: %v", a, e)
					}
					return e
				}
				return nil
			})
		}
	})

	t.Run("fetch-wait-cap", func(t *testing.T) {
		old := MaxFetchWait.Swap(200)
		t.Cleanup(func() { MaxFetchWait.Store(old) })
		ch := w.send(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", Partition: 0, Offset: 1 << 20, MaxWaitMs: math.MaxUint32}}})
		select {
		case r := <-ch:
			// Past the end: answered at once with OFFSET_OUT_OF_RANGE.
			if r.GetError().GetCode() != heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
				t.Fatalf("fetch past the end: %v", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("fetch past the end: no answer")
		}
		// At the end: the acks=none produce of "acks" may land after the
		// end is read, so a fetch that finds records moves past them.
		end := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{Topic: "t", Partition: 0, Spec: heraldpb.OffsetSpec_OFFSET_SPEC_LATEST}}}).GetListOffsetsResponse().Offset
		var start time.Time
		for tries := 0; ; tries++ {
			start = time.Now()
			ch = w.send(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", Partition: 0, Offset: end, MaxWaitMs: math.MaxUint32}}})
			var r *heraldpb.Frame
			select {
			case r = <-ch:
			case <-time.After(10 * time.Second):
				t.Fatal("a fetch with max_wait_ms 2^32-1 was not answered within 10 s (cap 200 ms)")
			}
			if r.GetError() != nil {
				t.Fatalf("long poll at the end: %v", r)
			}
			if bs := r.GetFetchResponse().GetBatches(); len(bs) > 0 && tries < 5 {
				end = bs[len(bs)-1].BaseOffset + int64(bs[len(bs)-1].Count)
				continue
			} else if len(bs) > 0 {
				t.Fatalf("long poll at the end: records keep coming: %v", r)
			}
			break
		}
		t.Logf("a fetch asking to wait 2^32-1 ms was answered after %v (cap %d ms)", time.Since(start).Round(time.Millisecond), MaxFetchWait.Load())
	})

	t.Run("zero-partitions", func(t *testing.T) {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "zero", Config: &heraldpb.TopicConfig{Partitions: 0, RetentionMs: 1000}}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST || !strings.Contains(e.GetMessage(), "at least 1") {
			t.Fatalf("partitions 0: %v", r)
		}
		// Without a config the broker's default-partitions applies.
		r = w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "dflt"}}})
		if n := len(r.GetCreateTopicResponse().GetTopic().GetPartitions()); n != 1 {
			t.Fatalf("no config: %d partitions, want the default 1", n)
		}
	})

	t.Run("group-names", func(t *testing.T) {
		long := strings.Repeat("g", 10_000)
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: long, Topic: "t"}}})
		e := r.GetError()
		if e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST || len(e.GetMessage()) > 300 || !strings.Contains(e.GetMessage(), "10000 bytes") {
			t.Fatalf("10,000-character group name: code %v, message of %d bytes: %.300s", e.GetCode(), len(e.GetMessage()), e.GetMessage())
		}
		r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: long}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_GROUP_NOT_FOUND || len(e.GetMessage()) > 300 {
			t.Fatalf("describe of a 10,000-character group: code %v, message of %d bytes", e.GetCode(), len(e.GetMessage()))
		}
		r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "__g", Topic: "t"}}})
		if e := r.GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST || !strings.Contains(e.GetMessage(), "names starting with __ are reserved") || strings.Contains(e.GetMessage(), "dlq") {
			t.Fatalf("group __g: %v", r)
		}
	})
}

// /readyz is 503 until the node has caught up after its start, then 200;
// /healthz stays the liveness check (issue 14 §5).
func TestReadyz(t *testing.T) {
	dir := t.TempDir()
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = dir, "127.0.0.1:0", "127.0.0.1:0"
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + b.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	checkFor(t, func() error {
		if code, body := get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %s", code, body)
		}
		return nil
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	if _, body := get("/cluster"); !strings.Contains(body, `"ready":true`) {
		t.Fatalf("/cluster: %s", body)
	}
	if ok, why := b.Ready(); !ok {
		t.Fatalf("Ready: %s", why)
	}
}
