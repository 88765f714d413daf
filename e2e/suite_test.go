package e2e

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// readPartition reads every committed message of a partition from the log
// start to the high watermark seen when it started.
func readPartition(t testing.TB, c *client.Client, topic string, part int32) []*client.Message {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	offs, err := c.ListOffsets(ctx, topic, part, heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, time.Time{})
	if err != nil {
		t.Fatalf("list offsets %s-%d: %v", topic, part, err)
	}
	var out []*client.Message
	next := offs.LogStart
	for next < offs.HighWatermark {
		res, err := c.Fetch(ctx, topic, part, next, 1<<20, 0)
		if err != nil {
			t.Fatalf("fetch %s-%d@%d: %v", topic, part, next, err)
		}
		if len(res.Messages) == 0 {
			t.Fatalf("fetch %s-%d@%d below hw %d returned nothing", topic, part, next, offs.HighWatermark)
		}
		for _, m := range res.Messages {
			if m.Offset != next {
				t.Fatalf("%s-%d: offset %d where %d was expected (offsets must be dense)", topic, part, m.Offset, next)
			}
			if m.Offset < offs.HighWatermark {
				out = append(out, m)
			}
			next++
		}
	}
	return out
}

// TestRoundTripKeyOrder produces keyed records through the batching producer
// and checks every record comes back once, at the offset Send reported, and
// that each key's records keep their order within one partition.
func TestRoundTripKeyOrder(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 60*time.Second)
		if _, err := c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 3}); err != nil {
			t.Fatal(err)
		}
		p := c.NewProducer(client.WithLinger(2 * time.Millisecond))
		const keys, perKey = 10, 100
		type sent struct {
			part int32
			off  int64
		}
		var mu sync.Mutex
		results := map[string]sent{}
		var errs []error
		for i := 0; i < perKey; i++ {
			for k := 0; k < keys; k++ {
				v := fmt.Sprintf("k%d-%04d", k, i)
				p.SendAsync(ctx, &client.Message{Topic: "orders", Key: []byte(fmt.Sprintf("k%d", k)), Value: []byte(v)},
					func(r client.Result, err error) {
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							errs = append(errs, err)
							return
						}
						results[v] = sent{r.Partition, r.Offset}
					})
			}
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if len(errs) > 0 {
			t.Fatalf("%d sends failed, first: %v", len(errs), errs[0])
		}
		seen := map[string]bool{}
		for part := int32(0); part < 3; part++ {
			last := map[string]int{}
			for _, m := range readPartition(t, c, "orders", part) {
				v := string(m.Value)
				if seen[v] {
					t.Fatalf("%s delivered twice", v)
				}
				seen[v] = true
				if s := results[v]; s.part != part || s.off != m.Offset {
					t.Fatalf("%s read at %d@%d, Send reported %d@%d", v, part, m.Offset, s.part, s.off)
				}
				if want := client.PartitionForKey(m.Key, 3); uint32(part) != want {
					t.Fatalf("key %s in partition %d, want %d", m.Key, part, want)
				}
				var k, i int
				fmt.Sscanf(v, "k%d-%d", &k, &i)
				if prev, ok := last[string(m.Key)]; ok && i <= prev {
					t.Fatalf("key %s: %d after %d (order broken)", m.Key, i, prev)
				}
				last[string(m.Key)] = i
			}
		}
		if len(seen) != keys*perKey {
			t.Fatalf("read %d records, sent %d", len(seen), keys*perKey)
		}
	})
}

// TestRestartKeepsData stops the broker gracefully and restarts it: every
// record and offset is still there, and producing continues after them.
func TestRestartKeepsData(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 60*time.Second)
		if _, err := c.CreateTopic(ctx, "r", &heraldpb.TopicConfig{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		p := c.NewProducer(client.WithManualPartitions())
		for i := 0; i < 50; i++ {
			if _, err := p.Send(ctx, &client.Message{Topic: "r", Partition: int32(i % 2), Value: []byte(fmt.Sprint(i))}); err != nil {
				t.Fatal(err)
			}
		}
		before := [][]*client.Message{readPartition(t, c, "r", 0), readPartition(t, c, "r", 1)}
		c.Close()
		n.Stop(t)
		n.Start(t)
		c = dial(t, n)
		for part := int32(0); part < 2; part++ {
			after := readPartition(t, c, "r", part)
			if len(after) != len(before[part]) {
				t.Fatalf("partition %d: %d records after restart, %d before", part, len(after), len(before[part]))
			}
			for i := range after {
				if string(after[i].Value) != string(before[part][i].Value) || after[i].Offset != before[part][i].Offset {
					t.Fatalf("partition %d record %d changed across restart", part, i)
				}
			}
		}
		r, err := c.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "r", Partition: 0, Value: []byte("after")})
		if err != nil {
			t.Fatal(err)
		}
		if r.Offset != 25 {
			t.Fatalf("first offset after restart %d, want 25", r.Offset)
		}
	})
}

// TestTopicAdmin covers create, list, describe, delete and their errors.
func TestTopicAdmin(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 30*time.Second)
		if _, err := c.CreateTopic(ctx, "a", &heraldpb.TopicConfig{Partitions: 4}); err != nil {
			t.Fatal(err)
		}
		expectCode(t, "duplicate create", heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS, func() error {
			_, err := c.CreateTopic(ctx, "a", nil)
			return err
		})
		expectCode(t, "bad name", heraldpb.ErrorCode_INVALID_REQUEST, func() error {
			_, err := c.CreateTopic(ctx, "bad/name", nil)
			return err
		})
		expectCode(t, "describe missing", heraldpb.ErrorCode_TOPIC_NOT_FOUND, func() error {
			_, err := c.DescribeTopic(ctx, "missing")
			return err
		})
		ti, err := c.DescribeTopic(ctx, "a")
		if err != nil || len(ti.Partitions) != 4 {
			t.Fatalf("describe: %v %v", ti, err)
		}
		list, err := c.ListTopics(ctx)
		if err != nil || len(list) != 1 || list[0].Name != "a" {
			t.Fatalf("list: %v %v", list, err)
		}
		if err := c.DeleteTopic(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		expectCode(t, "fetch deleted", heraldpb.ErrorCode_TOPIC_NOT_FOUND, func() error {
			_, err := c.Fetch(ctx, "a", 0, 0, 1024, 0)
			return err
		})
		if entries, _ := os.ReadDir(filepath.Join(n.DataDir(), "topics")); len(entries) != 3 || entries[0].Name() != "__groups-0" || entries[1].Name() != "__schedule-0" || entries[2].Name() != "__txn-0" {
			t.Fatalf("deleted topic left partition dirs: %v (want only the internal __groups-0, __schedule-0 and __txn-0)", entries)
		}
		// The name is free again.
		if _, err := c.CreateTopic(ctx, "a", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
	})
}

func expectCode(t testing.TB, what string, code heraldpb.ErrorCode, fn func() error) {
	t.Helper()
	err := fn()
	var he *client.Error
	if !errors.As(err, &he) || he.Code != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

// TestRetention writes past a small byte budget and checks the front of the
// log is deleted while the tail stays readable.
func TestRetention(t *testing.T) {
	forEachMode(t, []string{"--retention-check=50ms", "--segment-bytes=65536"}, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 60*time.Second)
		if _, err := c.CreateTopic(ctx, "ret", &heraldpb.TopicConfig{Partitions: 1, RetentionBytes: 256 << 10}); err != nil {
			t.Fatal(err)
		}
		p := c.NewProducer(client.WithManualPartitions())
		val := strings.Repeat("x", 1000)
		for i := 0; i < 1000; i++ {
			p.SendAsync(ctx, &client.Message{Topic: "ret", Partition: 0, Value: []byte(fmt.Sprintf("%06d%s", i, val))}, nil)
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		var offs client.Offsets
		checkFor(t, 20*time.Second, "retention to move the log start", func() error {
			var err error
			offs, err = c.ListOffsets(ctx, "ret", 0, heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST, time.Time{})
			if err != nil {
				return err
			}
			if offs.LogStart == 0 {
				return errors.New("log start still 0")
			}
			return nil
		})
		if offs.HighWatermark != 1000 {
			t.Fatalf("hw %d, want 1000", offs.HighWatermark)
		}
		expectCode(t, "fetch below log start", heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE, func() error {
			_, err := c.Fetch(ctx, "ret", 0, 0, 1024, 0)
			return err
		})
		msgs := readPartition(t, c, "ret", 0)
		if len(msgs) == 0 || msgs[len(msgs)-1].Offset != 999 {
			t.Fatalf("tail not readable after retention")
		}
		for _, m := range msgs {
			if want := fmt.Sprintf("%06d", m.Offset); string(m.Value[:6]) != want {
				t.Fatalf("offset %d holds record %s", m.Offset, m.Value[:6])
			}
		}
	})
}

// TestThrottledUnderOverload makes a partition's mailbox tiny and floods it
// from many concurrent producers: the broker answers THROTTLED (counted in
// /metrics), the SDK backs off and retries, and every record lands once.
func TestThrottledUnderOverload(t *testing.T) {
	forEachMode(t, []string{"--partition-mailbox=2"}, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 120*time.Second)
		if _, err := c.CreateTopic(ctx, "hot", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		const producers, each = 16, 200
		var wg sync.WaitGroup
		errc := make(chan error, producers)
		for w := 0; w < producers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				pc := dial(t, n)
				// Linger 0 and tiny batches: many small concurrent requests.
				p := pc.NewProducer(client.WithLinger(0), client.WithBatchBytes(256), client.WithMaxRetries(1000), client.WithManualPartitions())
				for i := 0; i < each; i++ {
					p.SendAsync(ctx, &client.Message{Topic: "hot", Partition: 0, Value: []byte(fmt.Sprintf("%d-%d", w, i))}, func(_ client.Result, err error) {
						if err != nil {
							select {
							case errc <- err:
							default:
							}
						}
					})
				}
				if err := p.Close(ctx); err != nil {
					errc <- err
				}
			}(w)
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatalf("producer error: %v", err)
		}
		msgs := readPartition(t, c, "hot", 0)
		seen := map[string]bool{}
		for _, m := range msgs {
			if seen[string(m.Value)] {
				t.Fatalf("%s stored twice", m.Value)
			}
			seen[string(m.Value)] = true
		}
		if len(seen) != producers*each {
			t.Fatalf("stored %d records, want %d", len(seen), producers*each)
		}
		if got := metricSum(t, n, "herald_throttled_total"); got == 0 {
			t.Fatal("no request was throttled; the test did not overload the partition")
		}
	})
}

// metricSum adds up every sample of a counter or gauge from /metrics.
func metricSum(t testing.TB, n node, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		var v float64
		fields := strings.Fields(line)
		fmt.Sscan(fields[len(fields)-1], &v)
		sum += v
	}
	return sum
}

// rawConn speaks frames on a plain socket, for the bad-input tests.
type rawConn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func rawDial(t testing.TB, n node) *rawConn {
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) send(f *heraldpb.Frame) {
	raw, err := heraldpb.AppendFrame(nil, f)
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.write(raw)
}

func (rc *rawConn) write(b []byte) {
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

// read returns the next frame, or nil at EOF.
func (rc *rawConn) read() *heraldpb.Frame {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		rc.t.Fatalf("read: %v", err)
	}
	buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(rc.r, buf); err != nil {
		rc.t.Fatalf("read payload: %v", err)
	}
	f, err := heraldpb.DecodeFrame(buf)
	if err != nil {
		rc.t.Fatalf("broker sent an undecodable frame: %v", err)
	}
	return f
}

// TestBadFrames sends each kind of bad input to a real broker: each gets a
// final error frame and its connection is closed, while a healthy
// connection opened before keeps working.
func TestBadFrames(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		good := dial(t, n)
		ctx := ctxT(t, 30*time.Second)
		if _, err := good.CreateTopic(ctx, "ok", nil); err != nil {
			t.Fatal(err)
		}
		unknown := []byte{0x08, 0x07, 0xfa, 0x07, 0x00} // id 7, field 127 (unknown), empty
		cases := []struct {
			name  string
			bytes []byte
			code  heraldpb.ErrorCode
		}{
			{"garbage", append([]byte{0, 0, 0, 6}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), heraldpb.ErrorCode_MALFORMED_FRAME},
			{"oversized", []byte{0x7f, 0xff, 0xff, 0xff}, heraldpb.ErrorCode_FRAME_TOO_LARGE},
			{"unknown body", append([]byte{0, 0, 0, byte(len(unknown))}, unknown...), heraldpb.ErrorCode_UNKNOWN_REQUEST},
		}
		for _, tc := range cases {
			rc := rawDial(t, n)
			rc.write(tc.bytes)
			f := rc.read()
			if f.GetError().GetCode() != tc.code {
				t.Fatalf("%s: got %v, want error %v", tc.name, f, tc.code)
			}
			if extra := rc.read(); extra != nil {
				t.Fatalf("%s: connection still open, got %v", tc.name, extra)
			}
		}
		// A response body sent as a request is a protocol violation too.
		rc := rawDial(t, n)
		rc.send(&heraldpb.Frame{Id: 9, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}})
		if f := rc.read(); f.GetError() == nil {
			t.Fatalf("response body as request: got %v", f)
		}
		// Truncated frame, then close: the broker just drops the connection.
		rc = rawDial(t, n)
		rc.write([]byte{0, 0, 0, 100, 1, 2, 3})
		rc.c.Close()
		// The healthy connection carries on.
		if _, err := good.NewProducer(client.WithManualPartitions()).Send(ctx, &client.Message{Topic: "ok", Partition: 0, Value: []byte("still here")}); err != nil {
			t.Fatalf("healthy connection broken by another's bad frames: %v", err)
		}
		// An invalid batch inside a valid frame is a request error, not a
		// protocol error: the connection stays open.
		rc = rawDial(t, n)
		rc.send(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}})
		rc.read()
		part := uint32(0)
		rc.send(&heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "ok", Partition: &part, Records: []byte{0xff}}}})
		if f := rc.read(); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
			t.Fatalf("bad batch: %v", f)
		}
		rec, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("v")}}})
		rc.send(&heraldpb.Frame{Id: 3, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "ok", Partition: &part, Records: rec}}})
		if f := rc.read(); f.GetProduceResponse() == nil || f.Id != 3 {
			t.Fatalf("produce after bad batch: %v", f)
		}
	})
}

// metricPresent reports whether /metrics has a sample of name.
func metricPresent(t testing.TB, n node, name string) bool {
	t.Helper()
	resp, err := http.Get("http://" + n.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			return true
		}
	}
	return false
}
