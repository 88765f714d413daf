package chaos

import (
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// finalReads reads, offline, every replica of topic's partitions that the
// stopped nodes hold: one history.FinalRead op per node and partition.
// Each replica's directory is copied under scratch first and the copy is
// opened, so that recovery (which may cut a torn tail or quarantine a
// damaged segment) leaves the nodes' own files as the run left them.
func finalReads(dataDirs map[int]string, topic string, scratch string) ([]history.Op, error) {
	var ops []history.Op
	nodes := make([]int, 0, len(dataDirs))
	for n := range dataDirs {
		nodes = append(nodes, n)
	}
	sort.Ints(nodes)
	for _, n := range nodes {
		// A cluster node keeps replicas/<topic>-<p>-<replica>; a single
		// node topics/<topic>-<p>.
		dirs, err := filepath.Glob(filepath.Join(dataDirs[n], "replicas", topic+"-*"))
		if err != nil {
			return nil, err
		}
		single, err := filepath.Glob(filepath.Join(dataDirs[n], "topics", topic+"-*"))
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, single...)
		sort.Strings(dirs)
		for _, dir := range dirs {
			part, ok := replicaPartition(filepath.Base(dir), topic)
			if !ok {
				continue // another topic whose name starts with topic-
			}
			copyDir := filepath.Join(scratch, fmt.Sprintf("node-%d", n), filepath.Base(dir))
			if err := copyTree(dir, copyDir); err != nil {
				return nil, fmt.Errorf("copying node %d's replica %s: %w", n, dir, err)
			}
			recs, err := readLog(copyDir, fmt.Sprintf("%s-%d", topic, part))
			if err != nil {
				return nil, fmt.Errorf("reading node %d's replica of %s/%d: %w", n, topic, part, err)
			}
			ops = append(ops, history.Op{Process: "final-read", Type: history.OK, F: history.FinalRead, Topic: topic,
				Partition: int32(part), Node: n, Records: recs})
		}
	}
	return ops, nil
}

// replicaPartition parses "<topic>-<partition>-<replica>" (a cluster
// replica's directory) or "<topic>-<partition>" (a single node's).
func replicaPartition(base, topic string) (int, bool) {
	rest, ok := strings.CutPrefix(base, topic+"-")
	if !ok {
		return 0, false
	}
	p, _, _ := strings.Cut(rest, "-")
	n, err := strconv.Atoi(p)
	return n, err == nil && n >= 0
}

// readLog reads every record of the log in dir, in offset order.
func readLog(dir, group string) ([]history.Record, error) {
	log, err := persistence.Open(persistence.Options{Dir: dir, Group: group, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	defer log.Close()
	var out []history.Record
	for off := log.StartOffset(); off < log.EndOffset(); {
		batches, err := log.ReadBatches(off, 1<<20, log.EndOffset())
		if err != nil {
			return out, err
		}
		if len(batches) == 0 {
			return out, fmt.Errorf("no batch at offset %d below the end %d", off, log.EndOffset())
		}
		for _, b := range batches {
			var derr error
			err := heraldpb.ForEachRawRecord(b.Records, func(i int, raw []byte) bool {
				var r heraldpb.Record
				if derr = proto.Unmarshal(raw, &r); derr != nil {
					return false
				}
				out = append(out, history.Record{Offset: b.BaseOffset + int64(i), Key: string(r.Key), Value: string(r.Value)})
				return true
			})
			if err == nil {
				err = derr
			}
			if err != nil {
				return out, fmt.Errorf("batch at %d: %w", b.BaseOffset, err)
			}
			off = b.BaseOffset + int64(b.Count)
		}
	}
	return out, nil
}

// copyTree copies the regular files under src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
