package partition

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func TestPrioIndexQuery(t *testing.T) {
	var x prioIndex
	x.reset(0, 0)
	for _, o := range []int64{3, 7, 8, 20, 21, 22} {
		x.put(5, o)
	}
	x.put(9, 4)
	cases := []struct {
		level     int
		from, to  int64
		limit     int
		want      []int64
		wantNext  int64
		gapLo, gH int64
	}{
		{5, 0, 100, 10, []int64{3, 7, 8, 20, 21, 22}, 100, 0, 0},
		{5, 0, 100, 2, []int64{3, 7}, 8, 0, 0},
		{5, 8, 21, 10, []int64{8, 20}, 21, 0, 0},
		{9, 5, 100, 10, nil, 100, 0, 0},
		{1, 0, 100, 10, nil, 100, 0, 0},
		// A gap [10, 30) caps the answer at its start.
		{5, 0, 100, 10, []int64{3, 7, 8}, 10, 10, 30},
		{5, 12, 100, 10, nil, 12, 10, 30},
	}
	for i, c := range cases {
		x.gapLo, x.gapHi = c.gapLo, c.gH
		got, next := x.query(c.level, c.from, c.to, c.limit)
		if !slices.Equal(got, c.want) || next != c.wantNext {
			t.Errorf("case %d: query(%d, %d, %d, %d) = %v, %d; want %v, %d", i, c.level, c.from, c.to, c.limit, got, next, c.want, c.wantNext)
		}
	}
	x.gapLo, x.gapHi = 0, 0
	if e := x.end(5); e != 23 {
		t.Errorf("end(5) = %d, want 23", e)
	}
	x.trim(8)
	if got, _ := x.query(5, 0, 100, 10); !slices.Equal(got, []int64{8, 20, 21, 22}) {
		t.Errorf("after trim(8): %v", got)
	}
	if e := x.end(9); e != 0 {
		t.Errorf("end(9) after trim = %d, want 0", e)
	}
}

func TestPrioFileRoundTrip(t *testing.T) {
	var x prioIndex
	x.reset(0, 0)
	for o := int64(0); o < 5000; o++ {
		if p := uint8(o*7%10) % Levels; p > 0 {
			x.put(p, o)
		}
	}
	data, err := x.encode(5000)
	if err != nil {
		t.Fatal(err)
	}
	lv, through, err := decodePrio(data)
	if err != nil || through != 5000 {
		t.Fatalf("decode: through %d, %v", through, err)
	}
	for l := 1; l < Levels; l++ {
		if (lv[l] == nil) != (x.lv[l] == nil) || lv[l] != nil && !lv[l].Equals(x.lv[l]) {
			t.Fatalf("level %d differs after a round trip", l)
		}
	}
	// Every damaged copy is refused, never half read.
	for _, i := range []int{0, 4, 5, 13, len(data) / 2, len(data) - 1} {
		bad := slices.Clone(data)
		bad[i] ^= 0x40
		if _, _, err := decodePrio(bad); err == nil {
			t.Errorf("a flipped byte at %d was accepted", i)
		}
	}
	if _, _, err := decodePrio(data[:len(data)-3]); err == nil {
		t.Error("a truncated file was accepted")
	}
}

// FuzzDecodePrio: decoding any bytes as an index file errors or yields
// bitmaps, and never panics.
func FuzzDecodePrio(f *testing.F) {
	var x prioIndex
	x.reset(0, 0)
	x.put(3, 10)
	x.put(9, 1<<40)
	good, _ := x.encode(11)
	f.Add(good)
	f.Add([]byte("HPRI"))
	f.Fuzz(func(t *testing.T, b []byte) {
		lv, through, err := decodePrio(b)
		if err != nil {
			return
		}
		if through < 0 {
			t.Fatalf("negative offset %d accepted", through)
		}
		for _, bm := range lv {
			if bm != nil {
				_ = bm.GetCardinality()
			}
		}
	})
}

// prioPartition runs partition t-0 with a tiny window (so priority fetches
// also read the log through the reader pool) and its index file in dir.
type prioPartition struct {
	t     *testing.T
	sys   *actor.ActorSystem
	dir   string
	pid   *actor.PID
	stats *Stats
	in    *inbox
}

func (pp *prioPartition) start() {
	pp.t.Helper()
	readers := NewReaderPool(pp.sys, 2, 64)
	pp.t.Cleanup(readers.Close)
	dir := pp.dir
	pp.stats = &Stats{}
	props, err := Props(pp.sys, Config{
		Topic: "t", Partition: 0, ReplicaID: 1, Peers: map[uint64]*actor.PID{1: actor.NewPID(pp.sys.Address(), "prio/t-0")},
		Open: func() (Storage, error) {
			return persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
		},
		IndexPath: filepath.Join(dir, "priority.idx"), IndexSaveInterval: 50 * time.Millisecond,
		WindowBytes: 1, TickInterval: 10 * time.Millisecond, Readers: readers,
	}, pp.stats)
	if err != nil {
		pp.t.Fatal(err)
	}
	if pp.pid, err = pp.sys.Root.SpawnNamed(props, "prio/t-0"); err != nil {
		pp.t.Fatal(err)
	}
	pp.in = newInbox(pp.sys)
	checkFor(pp.t, 10*time.Second, "leadership", func() bool { return pp.stats.Writable.Load() })
}

func (pp *prioPartition) stop() { pp.sys.Root.StopFuture(pp.pid).Wait() }

// queue reads level's whole sub-queue, maxBytes at a time.
func (pp *prioPartition) queue(level uint32, maxBytes uint32) ([]int64, []string) {
	pp.t.Helper()
	var offs []int64
	var vals []string
	hw := pp.stats.HighWatermark.Load()
	for off := int64(0); off < hw; {
		pp.sys.Root.RequestWithCustomSender(pp.pid, &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: "t", Offset: off, MaxBytes: maxBytes, Priority: level,
		}}}, pp.in.pid)
		f := pp.in.next(pp.t)
		resp := f.GetFetchResponse()
		if resp == nil {
			pp.t.Fatalf("priority %d fetch at %d: %v", level, off, f.GetError())
		}
		if resp.NextOffset <= off {
			pp.t.Fatalf("priority %d fetch at %d: next %d does not move", level, off, resp.NextOffset)
		}
		for _, b := range resp.Batches {
			var rb heraldpb.RecordBatch
			if err := proto.Unmarshal(b.Records, &rb); err != nil || len(rb.Records) != 1 || b.Count != 1 {
				pp.t.Fatalf("priority fetch returned a batch of %d records (%v)", len(rb.Records), err)
			}
			if rb.Records[0].Priority != level {
				pp.t.Fatalf("priority %d fetch returned a record of priority %d at %d", level, rb.Records[0].Priority, b.BaseOffset)
			}
			offs = append(offs, b.BaseOffset)
			vals = append(vals, string(rb.Records[0].Value))
		}
		off = resp.NextOffset
	}
	return offs, vals
}

// TestPrioritySubQueues: each level's sub-queue lists exactly the records
// of that priority, in order, from the window and from the log; it
// survives a restart through its file, and is rebuilt from the log when the
// file is damaged or missing; retention trims it.
func TestPrioritySubQueues(t *testing.T) {
	sys := actor.NewActorSystem()
	pp := &prioPartition{t: t, sys: sys, dir: t.TempDir()}
	pp.start()

	want := map[uint32][]int64{}
	off := int64(0)
	for i := 0; i < 120; i++ {
		b := &heraldpb.RecordBatch{}
		for j := 0; j < 5; j++ {
			p := uint32((i*5 + j*3) % 10)
			if i%4 == 0 {
				p = 0 // batches with no priority at all
			}
			b.Records = append(b.Records, &heraldpb.Record{Value: []byte{byte('a' + p), byte(off)}, Priority: p})
			if p > 0 {
				want[p] = append(want[p], off)
			}
			off++
		}
		raw, _ := proto.Marshal(b)
		sys.Root.RequestWithCustomSender(pp.pid, &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "t", Records: raw,
		}}}, pp.in.pid)
		if r := pp.in.next(t).GetProduceResponse(); r == nil {
			t.Fatal("produce failed")
		}
	}
	check := func(stage string) {
		t.Helper()
		for l := uint32(1); l < Levels; l++ {
			for _, mb := range []uint32{1 << 20, 10} {
				got, vals := pp.queue(l, mb)
				if !slices.Equal(got, want[l]) {
					t.Fatalf("%s: level %d (max bytes %d): %v, want %v", stage, l, mb, got, want[l])
				}
				for i, v := range vals {
					if v[0] != byte('a'+l) || v[1] != byte(got[i]) {
						t.Fatalf("%s: level %d offset %d holds %q", stage, l, got[i], v)
					}
				}
			}
			wantEnd := int64(0)
			if n := len(want[l]); n > 0 {
				wantEnd = want[l][n-1] + 1
			}
			if e := pp.stats.PriorityEnd[l].Load(); e != wantEnd {
				t.Fatalf("%s: PriorityEnd[%d] = %d, want %d", stage, l, e, wantEnd)
			}
		}
	}
	check("live")

	// A restart loads the saved file: complete at once.
	pp.stop()
	if _, err := os.Stat(filepath.Join(pp.dir, "priority.idx")); err != nil {
		t.Fatalf("no index file after stop: %v", err)
	}
	pp.start()
	check("restart")

	// A damaged file, then none: rebuilt from the log.
	for _, damage := range []func(path string){
		func(path string) {
			b, _ := os.ReadFile(path)
			b[len(b)/2] ^= 1
			_ = os.WriteFile(path, b, 0o640)
		},
		func(path string) { _ = os.Remove(path) },
	} {
		pp.stop()
		damage(filepath.Join(pp.dir, "priority.idx"))
		pp.start()
		checkFor(t, 10*time.Second, "the rebuilt index", func() bool { return pp.stats.PriorityEnd[9].Load() != 0 })
		check("rebuilt")
	}

	// Bad level: a typed error.
	sys.Root.RequestWithCustomSender(pp.pid, &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: "t", Priority: 10,
	}}}, pp.in.pid)
	if e := pp.in.next(t).GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("priority 10: %v, want INVALID_REQUEST", e)
	}

	// Compaction from the front trims every level.
	res, err := sys.Root.RequestFuture(pp.pid, &DeleteBefore{Offset: 300}, 10*time.Second).Result()
	if err != nil || res.(*DeleteBeforeResult).Err != nil {
		t.Fatalf("DeleteBefore: %v %v", err, res)
	}
	start := pp.stats.StartOffset.Load()
	if start == 0 {
		t.Fatal("DeleteBefore removed nothing")
	}
	for l := range want {
		want[l] = slices.DeleteFunc(want[l], func(o int64) bool { return o < start })
	}
	check("trimmed")
	pp.stop()
}

// produceBatches appends n batches of 5 records to pp, priorities cycling
// through 0-9, and returns the offsets of each level.
func (pp *prioPartition) produceBatches(n int) map[uint8][]int64 {
	pp.t.Helper()
	want := map[uint8][]int64{}
	off := pp.stats.HighWatermark.Load()
	for i := 0; i < n; i++ {
		b := &heraldpb.RecordBatch{}
		for j := 0; j < 5; j++ {
			p := uint32(off % 10)
			b.Records = append(b.Records, &heraldpb.Record{Value: []byte{byte(p)}, Priority: p})
			if p > 0 {
				want[uint8(p)] = append(want[uint8(p)], off)
			}
			off++
		}
		raw, _ := proto.Marshal(b)
		pp.sys.Root.RequestWithCustomSender(pp.pid, &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "t", Records: raw,
		}}}, pp.in.pid)
		if r := pp.in.next(pp.t).GetProduceResponse(); r == nil {
			pp.t.Fatal("produce failed")
		}
	}
	return want
}

// Retention (or compaction) removing the front of the log while the
// catch-up read is on its way does not end the catch-up: it goes on from
// the new start and reaches the end of the gap.
func TestCatchUpSurvivesRetention(t *testing.T) {
	sys := actor.NewActorSystem()
	pp := &prioPartition{t: t, sys: sys, dir: t.TempDir()}
	pp.start()
	want := pp.produceBatches(40)
	pp.stop()

	store, err := persistence.Open(persistence.Options{Dir: pp.dir, Group: "t-0"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	last, _ := store.LastIndex()
	hw := store.EndOffset()
	defer func(n int) { catchUpChunkBytes = n }(catchUpChunkBytes)
	catchUpChunkBytes = 1 // a batch at a time

	var got []int64
	var upTo int64
	chunks := 0
	catchUp(store, 0, hw, func(c prioChunk) bool {
		chunks++
		if c.err != nil {
			t.Errorf("catch-up failed after %d chunks: %v", chunks, c.err)
			return false
		}
		if chunks == 1 {
			if _, err := store.DeleteBefore(100, last); err != nil {
				t.Fatal(err)
			}
		}
		for i, o := range c.offs {
			if c.levels[i] == 9 {
				got = append(got, o)
			}
		}
		upTo = c.upTo
		return true
	})
	if upTo != hw {
		t.Fatalf("catch-up reached %d, want %d", upTo, hw)
	}
	start := store.StartOffset()
	if start < 100 {
		t.Fatalf("DeleteBefore left the start at %d", start)
	}
	got = slices.DeleteFunc(got, func(o int64) bool { return o < start })
	w9 := slices.DeleteFunc(slices.Clone(want[9]), func(o int64) bool { return o < start })
	if !slices.Equal(got, w9) {
		t.Fatalf("level 9 found %v, want %v", got, w9)
	}
}

// A snapshot install indexes the log again (openPrio) while the catch-up of
// the open may have a chunk on its way: that chunk is of the earlier
// catch-up and changes nothing; the new catch-up indexes every level.
func TestPrioChunkOfAnEarlierCatchUpIsIgnored(t *testing.T) {
	sys := actor.NewActorSystem()
	pp := &prioPartition{t: t, sys: sys, dir: t.TempDir()}
	pp.start()
	want := pp.produceBatches(40)
	pp.stop()
	path := filepath.Join(pp.dir, "priority.idx")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	store, err := persistence.Open(persistence.Options{Dir: pp.dir, Group: "t-0"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	defer func(n int) { catchUpChunkBytes = n }(catchUpChunkBytes)
	catchUpChunkBytes = 1 // a batch at a time

	chunks := make(chan prioChunk, 16)
	self := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(prioChunk); ok {
			chunks <- m
		}
	}))
	next := func() prioChunk {
		t.Helper()
		select {
		case c := <-chunks:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no catch-up chunk")
			return prioChunk{}
		}
	}
	a := &Actor{cfg: Config{IndexPath: path}, sys: sys, self: self, store: store, hw: store.EndOffset(), gen: writerGens.Add(1),
		stats: &Stats{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer a.stopCatchUp()

	a.openPrio()
	a.onPrioChunk(next()) // [0, 5)
	stale := next()       // [5, 10), not handled yet
	if stale.offs[0] != 5 {
		t.Fatalf("second chunk starts at %d", stale.offs[0])
	}
	a.openPrio() // a snapshot was installed
	a.onPrioChunk(stale)
	if a.prio.gapLo != 0 {
		t.Fatalf("a chunk of the earlier catch-up moved the gap to %d", a.prio.gapLo)
	}
	for !a.prio.complete() {
		a.onPrioChunk(next())
	}
	for l := uint8(1); l < Levels; l++ {
		got, _ := a.prio.query(int(l), 0, a.hw, 1000)
		if !slices.Equal(got, want[l]) {
			t.Fatalf("level %d: %v, want %v", l, got, want[l])
		}
	}
}

// FuzzDecodePrioBody: as FuzzDecodePrio, with the checksum made right, so
// that the levels' bitmaps are decoded (FuzzDecodePrio's inputs almost never
// get past the checksum): decoding never panics, never allocates memory out
// of proportion to the input (a bucket count the bitmap library would
// allocate for up front exhausted memory: testdata/fuzz/FuzzDecodePrioBody),
// and what it accepts can be queried and trimmed.
func FuzzDecodePrioBody(f *testing.F) {
	var x prioIndex
	x.reset(0, 0)
	x.put(3, 10)
	x.put(9, 1<<40)
	for o := int64(100); o < 5000; o += 3 {
		x.put(5, o)
	}
	good, _ := x.encode(11)
	f.Add(good[:len(good)-4])
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli))
		lv, through, err := decodePrio(b)
		if err != nil {
			return
		}
		if through < 0 {
			t.Fatalf("negative offset %d accepted", through)
		}
		var y prioIndex
		y.lv = lv
		for l, bm := range lv {
			if bm != nil {
				_ = bm.GetCardinality()
				_, _ = y.query(l, 0, math.MaxInt64, 10)
				_ = y.end(l)
			}
		}
		y.trim(50)
	})
}
