package persistence

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// BenchmarkSave saves Readies of 1 and 64 entries, each a LogEntry with a
// 1 KiB record batch, under flush=always: one fsync per Save. Compare ns/op
// of batch=1 with BenchmarkFsync to see what the WAL adds to the disk's
// fsync rate.
func BenchmarkSave(b *testing.B) {
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			opts, _ := testOptions(b, b.TempDir())
			l := mustOpen(b, opts)
			defer l.Close()
			g := &gen{term: 1, recLen: 1024}
			var idx uint64 = 1
			b.SetBytes(int64(batch * 1024))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ents := g.entries(idx, batch, 1)
				b.StartTimer()
				if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: idx - 1}, ents); err != nil {
					b.Fatal(err)
				}
				idx += uint64(batch)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}

// BenchmarkFsync is the baseline: append 1 KiB to a file and fsync it.
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1024)
	b.SetBytes(1024)
	for i := 0; i < b.N; i++ {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}
