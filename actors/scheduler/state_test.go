package scheduler

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"google.golang.org/protobuf/proto"
)

// The state tests run the scheduler's pure core without actors, disk or
// a clock: time is an argument.

func scheduleEv(at int64, id *uint64) *heraldpb.ScheduleEvent {
	return &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Schedule{Schedule: &heraldpb.ScheduledBatch{Topic: "t", DeliverAtMs: at, Id: id}}}
}

func refsOf(st *state) []uint64 { return st.pending.ToArray() }

func TestStateReplay(t *testing.T) {
	st := newState()
	var timers []timewheel.Entry
	replay := func(off uint64, ev *heraldpb.ScheduleEvent) {
		if e, ok := st.apply(off, ev); ok {
			timers = append(timers, e)
		}
	}
	replay(0, scheduleEv(100, nil))
	replay(1, scheduleEv(200, nil))
	replay(2, scheduleEv(300, nil))
	replay(3, &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Cancel{Cancel: &heraldpb.ScheduleCancel{Ref: 1}}})
	// Compaction moved batch 0 up the log: a copy at 4 (with its id), the
	// original cancelled (in the same append).
	replay(4, scheduleEv(100, proto.Uint64(0)))
	replay(5, &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Cancel{Cancel: &heraldpb.ScheduleCancel{Ref: 0}}})
	in := &heraldpb.FireIntent{Refs: []uint64{2, 4}, Topic: "t", Partition: 1, FromOffset: 7, Token: 9}
	replay(6, &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Firing{Firing: &heraldpb.ScheduleFiring{Intents: []*heraldpb.FireIntent{in}}}})
	if got := refsOf(&st); !slices.Equal(got, []uint64{2, 4}) {
		t.Fatalf("pending %v, want 2 and 4", got)
	}
	if st.moved[0] != 4 || st.origOf[4] != 0 {
		t.Fatalf("moves %v / %v, want id 0 at ref 4", st.moved, st.origOf)
	}
	if len(st.intents) != 2 || st.intents[4] != in {
		t.Fatalf("intents %v", st.intents)
	}
	want := []timewheel.Entry{{At: 100, Ref: 0}, {At: 200, Ref: 1}, {At: 300, Ref: 2}, {At: 100, Ref: 4}}
	if !slices.Equal(timers, want) {
		t.Fatalf("timers %v, want %v (cancelled ones stay in the wheel until due)", timers, want)
	}
	rs := st.recoveries()
	if len(rs) != 1 || rs[0].topic != "t" || rs[0].part != 1 || rs[0].from != 7 {
		t.Fatalf("recoveries %+v", rs)
	}
	wantKeys := map[string]uint64{fireKey(2, 9): 2, fireKey(0, 9): 4} // a moved batch carries its original id
	if !maps.Equal(rs[0].want, wantKeys) {
		t.Fatalf("recovery looks for %v, want %v", rs[0].want, wantKeys)
	}
	replay(7, &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Fired{Fired: &heraldpb.ScheduleFired{Refs: []uint64{2, 4}}}})
	if !st.pending.IsEmpty() || len(st.intents) != 0 || len(st.moved) != 0 || len(st.origOf) != 0 {
		t.Fatalf("after the fire: pending %v, intents %v, moves %v %v", refsOf(&st), st.intents, st.moved, st.origOf)
	}
	if rs := st.recoveries(); len(rs) != 0 {
		t.Fatalf("recoveries after the fire: %+v", rs)
	}
}

func TestRecoveriesGroupByPartition(t *testing.T) {
	st := newState()
	for _, r := range []uint64{1, 2, 3, 4} {
		st.pending.Add(r)
	}
	a := &heraldpb.FireIntent{Refs: []uint64{1, 2}, Topic: "t", Partition: 0, FromOffset: 50, Token: 1}
	b := &heraldpb.FireIntent{Refs: []uint64{3}, Topic: "t", Partition: 0, FromOffset: 40, Token: 2}
	c := &heraldpb.FireIntent{Refs: []uint64{4, 5}, Topic: "u", Partition: 0, FromOffset: 9, Token: 3}
	for _, in := range []*heraldpb.FireIntent{a, b, c} {
		for _, r := range in.Refs {
			st.intents[r] = in
		}
	}
	rs := st.recoveries()
	slices.SortFunc(rs, func(x, y recovery) int { return strings.Compare(x.topic, y.topic) })
	if len(rs) != 2 {
		t.Fatalf("recoveries %+v, want one per partition", rs)
	}
	if rs[0].from != 40 || !maps.Equal(rs[0].want, map[string]uint64{fireKey(1, 1): 1, fireKey(2, 1): 2, fireKey(3, 2): 3}) {
		t.Fatalf("t/0: %+v (from the earliest announced end)", rs[0])
	}
	if rs[1].from != 9 || !maps.Equal(rs[1].want, map[string]uint64{fireKey(4, 3): 4}) {
		t.Fatalf("u/0: %+v (5 is not pending: done)", rs[1])
	}
}

func topicEntry(name string, parts int, maxBytes uint32) *registry.Entry {
	e := &registry.Entry{Name: name, Config: &heraldpb.TopicConfig{Partitions: uint32(parts), MaxMessageBytes: maxBytes}}
	for range parts {
		e.Partitions = append(e.Partitions, actor.NewPID("x", name))
		e.Stats = append(e.Stats, &partition.Stats{})
	}
	return e
}

func keyedBatch(key string, vals ...string) []byte {
	b := &heraldpb.RecordBatch{}
	for _, v := range vals {
		b.Records = append(b.Records, &heraldpb.Record{Key: []byte(key), Value: []byte(v)})
	}
	raw, _ := proto.Marshal(b)
	return raw
}

func TestCheckDelayed(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	e := topicEntry("t", 3, 0)
	small := topicEntry("t", 3, uint32(len(batchOf("x"))+tagBytes-1))
	for _, tc := range []struct {
		name string
		req  *heraldpb.ProduceRequest
		e    *registry.Entry
		code heraldpb.ErrorCode
		msg  string
	}{
		{"both times", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, DeliverAtMs: 5, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "not both"},
		{"negative sequence", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, ProducerId: 3, BaseSequence: -1, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "base_sequence -1 is negative"},
		{"delay too long", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 3_600_001, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "longer than the broker's max delay 1h0m0s"},
		{"negative time", &heraldpb.ProduceRequest{Topic: "t", DeliverAtMs: -1, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "is negative"},
		{"time too far", &heraldpb.ProduceRequest{Topic: "t", DeliverAtMs: 1_000_000 + 3_600_001, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "more than the broker's max delay"},
		{"internal topic", &heraldpb.ProduceRequest{Topic: "__schedule", DelayMs: 1, Records: batchOf("x")}, e, heraldpb.ErrorCode_INVALID_REQUEST, "is internal"},
		{"no topic", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, Records: batchOf("x")}, nil, heraldpb.ErrorCode_TOPIC_NOT_FOUND, `"t" does not exist`},
		{"bad batch", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, Records: []byte{0xff}}, e, heraldpb.ErrorCode_INVALID_REQUEST, ""},
		{"empty batch", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1}, e, heraldpb.ErrorCode_INVALID_REQUEST, "no records"},
		{"too large with its headers", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, Records: batchOf("x")}, small, heraldpb.ErrorCode_MESSAGE_TOO_LARGE, "bytes of headers"},
		{"no such partition", &heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, Partition: proto.Uint32(3), Records: batchOf("x")}, e, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition 3"},
	} {
		st := newState()
		_, _, _, err := st.checkDelayed(tc.req, tc.e, now, time.Hour)
		if err.GetCode() != tc.code || !strings.Contains(err.GetMessage(), tc.msg) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.code, tc.msg)
		}
	}

	st := newState()
	check := func(req *heraldpb.ProduceRequest) (int64, uint32, int) {
		t.Helper()
		at, part, n, err := st.checkDelayed(req, e, now, time.Hour)
		if err != nil {
			t.Fatalf("%v: %v", req, err)
		}
		return at, part, n
	}
	if at, part, n := check(&heraldpb.ProduceRequest{Topic: "t", DelayMs: 1500, Partition: proto.Uint32(2), Records: batchOf("a", "b")}); at != 1_001_500 || part != 2 || n != 2 {
		t.Fatalf("a delay, partition named: at %d, partition %d, %d records", at, part, n)
	}
	if at, part, _ := check(&heraldpb.ProduceRequest{Topic: "t", DeliverAtMs: 1_000_000 + 3_600_000, Records: keyedBatch("k", "a")}); at != 4_600_000 || part != heraldpb.PartitionForKey([]byte("k"), 3) {
		t.Fatalf("a time, keyed: at %d, partition %d", at, part)
	}
	var rr []uint32
	for range 4 {
		_, part, _ := check(&heraldpb.ProduceRequest{Topic: "t", DelayMs: 1, Records: batchOf("x")})
		rr = append(rr, part)
	}
	if !slices.Equal(rr, []uint32{0, 1, 2, 0}) {
		t.Fatalf("unkeyed batches went to %v, want round robin", rr)
	}
}

func TestCancelTarget(t *testing.T) {
	st := newState()
	for _, r := range []uint64{3, 4, 5, 9} {
		st.pending.Add(r)
	}
	st.busy[4] = struct{}{}
	st.cancelling[5] = 0
	st.noteMoved(1, 9) // batch 1 moved up the log to 9
	st.rewriting[3] = true
	for id, want := range map[string]heraldpb.ErrorCode{
		"x":  heraldpb.ErrorCode_INVALID_REQUEST,
		"3":  heraldpb.ErrorCode_THROTTLED,              // being moved
		"4":  heraldpb.ErrorCode_SCHEDULE_NOT_FOUND,     // being delivered
		"5":  heraldpb.ErrorCode_SCHEDULE_NOT_FOUND,     // being cancelled
		"9":  heraldpb.ErrorCode_ERROR_CODE_UNSPECIFIED, // the copy's ref works too
		"1":  heraldpb.ErrorCode_ERROR_CODE_UNSPECIFIED,
		"77": heraldpb.ErrorCode_SCHEDULE_NOT_FOUND,
	} {
		ref, e := st.cancelTarget(id)
		if e.GetCode() != want {
			t.Errorf("cancel %s: %v, want %v", id, e, want)
		}
		if want == heraldpb.ErrorCode_ERROR_CODE_UNSPECIFIED && ref != 9 {
			t.Errorf("cancel %s: ref %d, want 9", id, ref)
		}
	}
	if _, e := st.cancelTarget("3"); e.GetRetryAfterMs() == 0 {
		t.Errorf("THROTTLED without retry-after: %v", e)
	}
}

func TestKeepDueAndTakeRound(t *testing.T) {
	st := newState()
	for _, r := range []uint64{1, 2, 3, 4, 5, 6} {
		st.pending.Add(r)
	}
	st.busy[2] = struct{}{}
	st.cancelling[3] = 0
	due := []timewheel.Entry{{At: 10, Ref: 1}, {At: 10, Ref: 2}, {At: 11, Ref: 3}, {At: 12, Ref: 7}, {At: 12, Ref: 4}, {At: 13, Ref: 5}, {At: 13, Ref: 6}}
	kept := st.keepDue(slices.Clone(due))
	if want := []timewheel.Entry{{At: 10, Ref: 1}, {At: 12, Ref: 4}, {At: 13, Ref: 5}, {At: 13, Ref: 6}}; !slices.Equal(kept, want) {
		t.Fatalf("keepDue kept %v, want %v (not busy, being cancelled or done)", kept, want)
	}
	if st.cancelling[3] != 11 {
		t.Fatalf("a batch being cancelled notes its time (%d), to fire if the cancel fails", st.cancelling[3])
	}

	st.cancelling[5] = 0
	q := []timewheel.Entry{{At: 10, Ref: 1}, {At: 10, Ref: 1}, {At: 12, Ref: 4}, {At: 13, Ref: 5}, {At: 13, Ref: 6}, {At: 14, Ref: 8}}
	entries, n := st.takeRound(q, 2)
	if want := []timewheel.Entry{{At: 10, Ref: 1}, {At: 12, Ref: 4}}; !slices.Equal(entries, want) || n != 3 {
		t.Fatalf("takeRound(max 2) = %v after %d entries, want %v after 3 (a timer added twice goes once)", entries, n, want)
	}
	entries, n = st.takeRound(q[n:], 2)
	if want := []timewheel.Entry{{At: 13, Ref: 6}}; !slices.Equal(entries, want) || n != 3 {
		t.Fatalf("next round: %v after %d entries, want %v after 3", entries, n, want)
	}
	if _, ok := st.busy[6]; !ok || st.cancelling[5] != 13 {
		t.Fatalf("busy %v, cancelling %v", st.busy, st.cancelling)
	}
	if got := st.compactCut(100); got != 1 {
		t.Fatalf("compactCut = %d, want 1 (the oldest pending)", got)
	}
	st.pending.Clear()
	if got := st.compactCut(100); got != 1 {
		t.Fatalf("compactCut = %d, want 1 (the oldest busy)", got)
	}
	clear(st.busy)
	if got := st.compactCut(100); got != 100 {
		t.Fatalf("compactCut = %d, want the high watermark with nothing pending", got)
	}
}

func TestToMove(t *testing.T) {
	st := newState()
	for _, r := range []uint64{10, 30, 60, 150} {
		st.pending.Add(r)
	}
	st.busy[30] = struct{}{}
	refs, mid := st.toMove(10, 210)
	if !slices.Equal(refs, []uint64{10, 60}) || mid != 110 {
		t.Fatalf("toMove(10, 210) = %v below %d, want 10 and 60 below 110 (30 is being fired)", refs, mid)
	}
	if refs, _ := st.toMove(10, 20); refs != nil {
		t.Fatalf("toMove(10, 20) = %v: 10 in an older half of 5 records does not pay", refs)
	}
	if refs, _ := st.toMove(10, 11); refs != nil {
		t.Fatalf("toMove(10, 11) = %v, want none", refs)
	}
}

func TestTakeCached(t *testing.T) {
	raw := func(vals ...string) []byte { return batchOf(vals...) }
	cache := []*heraldpb.StoredBatch{
		{BaseOffset: 10, Count: 3, Records: raw("a", "b", "c")},
		{BaseOffset: 13, Count: 2, Records: raw("d", "e")},
		{BaseOffset: 20, Count: 1, Records: raw("f")},
	}
	r := &fireRound{raw: map[uint64][]byte{}, missing: []uint64{5, 11, 12, 14, 17, 20, 25}}
	takeCached(cache, r)
	if !slices.Equal(r.missing, []uint64{5, 17, 25}) {
		t.Fatalf("still missing %v, want 5 17 25", r.missing)
	}
	for ref, want := range map[uint64]string{11: "b", 12: "c", 14: "e", 20: "f"} {
		var rec heraldpb.Record
		if err := proto.Unmarshal(r.raw[ref], &rec); err != nil || string(rec.Value) != want {
			t.Fatalf("record %d: %q, %v; want %q", ref, rec.Value, err, want)
		}
	}
	takeCached(nil, r)
	if len(r.missing) != 3 {
		t.Fatalf("an empty cache took %v", r.missing)
	}
}

func TestGroupChunks(t *testing.T) {
	a, b := topicEntry("a", 2, 10), topicEntry("b", 1, 0)
	chunk := func(e *registry.Entry, part uint32, at int64, size int) *fireChunk {
		return &fireChunk{entry: e, part: part, at: at, refs: []uint64{uint64(at)}, records: make([]byte, size)}
	}
	nowUs := int64(100_000) // 100 ms
	c1, c2, c3 := chunk(a, 0, 90, 4), chunk(b, 0, 90, 4), chunk(a, 0, 95, 4)
	c4 := chunk(a, 0, 99, 4)                           // a's limit (10 bytes) is reached: a new append
	c5, c6 := chunk(a, 1, 100, 1), chunk(a, 1, 100, 1) // due now, same ms: one append
	c7 := chunk(a, 1, 101, 1)                          // not due yet, later ms: its own append
	got := groupChunks([]*fireChunk{c1, c2, c3, c4, c5, c6, c7}, nowUs)
	want := [][]*fireChunk{{c1, c3}, {c4}, {c2}, {c5, c6}, {c7}}
	if !slices.EqualFunc(got, want, func(x, y []*fireChunk) bool { return slices.Equal(x, y) }) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	if groupRefs(want[0]) != 2 || groupBytes(want[0]) != 8 {
		t.Fatalf("groupRefs %d, groupBytes %d", groupRefs(want[0]), groupBytes(want[0]))
	}
	for code, want := range map[heraldpb.ErrorCode]bool{
		heraldpb.ErrorCode_THROTTLED: true, heraldpb.ErrorCode_NOT_LEADER: true, heraldpb.ErrorCode_STORAGE_ERROR: true,
		heraldpb.ErrorCode_TOPIC_NOT_FOUND: false, heraldpb.ErrorCode_MESSAGE_TOO_LARGE: false, heraldpb.ErrorCode_INVALID_REQUEST: false,
	} {
		if got := retriable(&heraldpb.Error{Code: code}); got != want {
			t.Errorf("retriable(%v) = %v", code, got)
		}
	}
}
