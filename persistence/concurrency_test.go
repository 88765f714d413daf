package persistence

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// TestConcurrentReadsWhileSaving runs catch-up and tail readers, Term and
// Entries callers against an owner that saves, truncates suffixes and
// retains. Run it with -race.
func TestConcurrentReadsWhileSaving(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.SegmentBytes = 8 << 10 // many segments: readers hit older ones
	opts.SegmentCacheSize = 1
	opts.IndexIntervalBytes = 1 << 10
	opts.CacheBytes = 4 << 10
	l := mustOpen(t, opts)
	defer l.Close()

	var hw atomic.Int64 // committed offsets, published by the owner
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	fail := make(chan error, 16)
	reader := func(fromStart bool) {
		defer wg.Done()
		var off int64
		for {
			select {
			case <-stop:
				return
			default:
			}
			limit := hw.Load()
			if fromStart || off < l.StartOffset() {
				off = l.StartOffset()
			}
			bs, err := l.ReadBatches(off, 4<<10, limit)
			if errors.Is(err, ErrOffsetOutOfRange) {
				off = 0 // retention moved the start; restart
				continue
			}
			if err != nil {
				fail <- err
				return
			}
			for _, b := range bs {
				if b.BaseOffset+int64(b.Count) > limit {
					fail <- errors.New("read past the high watermark")
					return
				}
				if b.BaseOffset > off {
					fail <- errors.New("gap in offsets")
					return
				}
				off = b.BaseOffset + int64(b.Count)
			}
			if fromStart && off >= limit {
				off = 0
			}
			reads.Add(1)
		}
	}
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go reader(i == 0)
	}
	wg.Add(1)
	go func() { // raft-ish readers
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			f, _ := l.FirstIndex()
			la, _ := l.LastIndex()
			if la >= f {
				l.Term(la)
				l.Entries(f, la+1, 8<<10)
				l.OffsetForTime(time.Now().UnixMilli())
			}
			l.Size()
		}
	}()

	g := &gen{term: 1, recLen: 256}
	var idx uint64 = 1
	start := time.Now()
	for round := 0; round < 400 || reads.Load() < 100; round++ {
		if time.Since(start) > 20*time.Second {
			break
		}
		n := 1 + round%8
		ents := g.entries(idx, n, 3)
		mustSave(t, l, raftpb.HardState{Term: g.term, Vote: 1, Commit: idx - 1}, ents)
		idx += uint64(n)
		// The owner commits all but the last entry.
		hw.Store(g.next - 3)
		if round%50 == 49 {
			// A leader change replaces the uncommitted last entry.
			g.term++
			g.next -= 3
			idx--
			mustSave(t, l, raftpb.HardState{Term: g.term, Vote: 1}, g.entries(idx, 1, 3))
			idx++
		}
		if round%100 == 99 {
			if _, err := l.Retain(time.Now(), 0, 40<<10, idx-5); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-fail:
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-fail:
		t.Fatal(err)
	default:
	}
	checkInvariants(t, l)
	t.Logf("%d reads while saving %d entries", reads.Load(), idx-1)
}
