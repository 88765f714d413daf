package persistence

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/tidwall/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

// testLogger discards below Warn unless -v, and records warnings so tests
// can assert that recovery reported what it did.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func testOptions(t testing.TB, dir string) (Options, *logSink) {
	sink := &logSink{}
	var w io.Writer = sink
	if testing.Verbose() {
		w = io.MultiWriter(sink, testWriter{t})
	}
	return Options{
		Dir:    dir,
		Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Group:  "test-0",
	}, sink
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func mustOpen(t testing.TB, opts Options) *Log {
	t.Helper()
	l, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

// gen builds raft entries whose LogEntry offsets continue from the log.
type gen struct {
	next   int64 // next offset
	term   uint64
	nowMs  int64
	recLen int
}

// entry returns a normal entry at index i carrying count records stamped
// with the generator's current time.
func (g *gen) entry(i uint64, count uint32) raftpb.Entry {
	le := &heraldpb.LogEntry{
		BaseOffset:     g.next,
		Count:          count,
		AppendTimeMs:   g.nowMs,
		MaxTimestampMs: g.nowMs,
		Records:        bytes.Repeat([]byte{byte(i)}, max(g.recLen, 1)),
	}
	data, err := proto.Marshal(le)
	if err != nil {
		panic(err)
	}
	g.next += int64(count)
	return raftpb.Entry{Index: i, Term: g.term, Type: raftpb.EntryNormal, Data: data}
}

// entries returns n entries from index i on with count records each.
func (g *gen) entries(i uint64, n int, count uint32) []raftpb.Entry {
	out := make([]raftpb.Entry, n)
	for k := range out {
		out[k] = g.entry(i+uint64(k), count)
	}
	return out
}

func mustSave(t testing.TB, l *Log, hs raftpb.HardState, ents []raftpb.Entry) {
	t.Helper()
	if err := l.Save(hs, ents); err != nil {
		t.Fatalf("Save: %v", err)
	}
}

func mustIndexes(t testing.TB, l *Log) (uint64, uint64) {
	t.Helper()
	f, err := l.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	la, err := l.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return f, la
}

// faultWAL wraps the real tidwall log so tests can fail writes and fsyncs.
// A failed write writes nothing (real short writes are exercised by the
// tmpfs ENOSPC test and the torn-tail tests).
type faultWAL struct {
	walLog
	mu        sync.Mutex
	failSync  error
	failWrite error
	syncs     int
}

func (f *faultWAL) set(sync, write error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failSync, f.failWrite = sync, write
}

func (f *faultWAL) Sync() error {
	f.mu.Lock()
	err := f.failSync
	f.syncs++
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.walLog.Sync()
}

func (f *faultWAL) WriteBatch(b *wal.Batch) error {
	f.mu.Lock()
	err := f.failWrite
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.walLog.WriteBatch(b)
}

// withFaultWAL arms opts so every WAL opened is wrapped; the returned
// function gives the wrapper of the most recent open.
func withFaultWAL(opts *Options) func() *faultWAL {
	var mu sync.Mutex
	var cur *faultWAL
	opts.wrapWAL = func(w walLog) walLog {
		mu.Lock()
		defer mu.Unlock()
		cur = &faultWAL{walLog: w}
		return cur
	}
	return func() *faultWAL {
		mu.Lock()
		defer mu.Unlock()
		return cur
	}
}
