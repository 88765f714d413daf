package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// hooks sets a fault through the fault endpoint of a -tags chaos build
// (Cluster.Faults) on the target's nodes at Start, and posts off at
// Stop. A node that was restarted or is down meanwhile holds no fault
// any more (the hooks live in the process), so it is skipped at Stop.
func hooks(e *Env, name string, t Target, on, off map[string]any) Nemesis {
	onJSON, _ := json.Marshal(on)
	offJSON, _ := json.Marshal(off)
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var set []uint64
		undo := func(ctx context.Context) (string, error) {
			var errs []error
			for _, id := range set {
				err := e.Cluster.Faults(ctx, id, off)
				if errors.Is(err, cluster.ErrNotRunning) && !e.Cluster.Running(id) {
					continue
				}
				errs = append(errs, err)
			}
			return fmt.Sprintf("POST /debug/faults %s to nodes %v", offJSON, set), errors.Join(errs...)
		}
		for _, id := range ids {
			if err := e.Cluster.Faults(ctx, id, on); err != nil {
				return set, fmt.Sprintf("POST /debug/faults %s to nodes %v", onJSON, set), undo, err
			}
			set = append(set, id)
		}
		return set, fmt.Sprintf("POST /debug/faults %s to nodes %v", onJSON, set), undo, nil
	})
}

// SlowDisk delays every disk write and fsync of the target's nodes by
// delay ({"disk_delay": delay}; Stop sets it back to 0s).
func SlowDisk(e *Env, t Target, delay time.Duration) Nemesis {
	return hooks(e, fmt.Sprintf("slow disk (%v) on %s", delay, t), t,
		map[string]any{"disk_delay": delay.String()}, map[string]any{"disk_delay": "0s"})
}

// FsyncError makes the target's nodes' fsyncs fail with EIO
// ({"fsync_error": "eio", "fsync_count": count}: count is passed to the
// hook as is; 0 is what the hooks take for "every fsync"). Stop clears
// every fault of those nodes ({"clear": true}).
func FsyncError(e *Env, t Target, count int) Nemesis {
	return hooks(e, fmt.Sprintf("fsync EIO (count %d) on %s", count, t), t,
		map[string]any{"fsync_error": "eio", "fsync_count": count}, map[string]any{"clear": true})
}

// WriteError makes the target's nodes' disk writes fail with EIO
// ({"write_error": "eio"}). Stop clears every fault of those nodes.
func WriteError(e *Env, t Target) Nemesis {
	return hooks(e, "write EIO on "+t.String(), t,
		map[string]any{"write_error": "eio"}, map[string]any{"clear": true})
}

// ClockJump moves the target's nodes' clock by offset, forward (positive)
// or back ({"clock_offset": offset}); Stop sets it back to 0s.
func ClockJump(e *Env, t Target, offset time.Duration) Nemesis {
	return hooks(e, fmt.Sprintf("clock %v on %s", offset, t), t,
		map[string]any{"clock_offset": offset.String()}, map[string]any{"clock_offset": "0s"})
}

// fillerName is the file DiskFull writes beside a node's data dir.
const fillerName = "chaos-filler"

// DiskFull fills the disk holding the target's nodes' data dirs (each a
// tmpfs of Config.DiskBytes: ErrUnsupported without) with a filler file
// until the writes fail with ENOSPC, so the brokers' next writes fail
// too. Stop deletes the filler.
func DiskFull(e *Env, t Target) Nemesis {
	return newFault(e, "disk full on "+t.String(), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var filled []uint64
		var files []string
		undo := func(context.Context) (string, error) {
			var errs []error
			for _, f := range files {
				if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			return fmt.Sprintf("deleted the fillers of nodes %v", filled), errors.Join(errs...)
		}
		var details []string
		detail := func() string { return strings.Join(details, "; ") }
		for _, id := range ids {
			n, err := e.Cluster.Node(id)
			if err != nil {
				return filled, detail(), undo, err
			}
			if n.DiskDir == "" {
				return filled, detail(), undo, fmt.Errorf("%w: a full disk needs the data dirs on tmpfs (Config.DiskBytes)", ErrUnsupported)
			}
			path := filepath.Join(n.DiskDir, fillerName)
			files = append(files, path)
			size, err := fill(path)
			if err != nil {
				return filled, detail(), undo, fmt.Errorf("filling node %d's disk: %w", id, err)
			}
			filled = append(filled, id)
			details = append(details, fmt.Sprintf("node %d: %s filled with %d MiB", id, n.DiskDir, size>>20))
		}
		return filled, detail(), undo, nil
	})
}

// fill appends zeros to path until the file system is full and returns
// the file's size.
func fill(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Big writes while they fit, then small ones to take the last pages.
	for _, chunk := range []int{1 << 20, 4 << 10} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if errors.Is(err, syscall.ENOSPC) {
					break
				}
				return 0, err
			}
		}
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Damage is a way to damage a WAL while its node is down.
type Damage int

const (
	// TornTail appends a partial entry (a length prefix promising 200
	// bytes, and 37 of them) to the last segment, as a crash in the
	// middle of a write leaves it.
	TornTail Damage = iota + 1
	// BitFlip flips one bit at a random place in the middle half of the
	// middle segment (of the older one of two).
	BitFlip
	// TruncatedSegment cuts the middle segment (the older one of two) to
	// half its length.
	TruncatedSegment
)

func (d Damage) String() string {
	switch d {
	case TornTail:
		return "torn tail"
	case BitFlip:
		return "bit flip"
	case TruncatedSegment:
		return "truncated segment"
	}
	return fmt.Sprintf("Damage(%d)", int(d))
}

// DamageWAL damages the WAL of the target's replica of topic's partition
// "between a stop and a start": at Start it SIGKILLs each target node,
// damages the log as d says and starts the node again (a node that was
// down is damaged and left down). What the node does with the damage
// (cut a torn tail, refuse writes, rebuild from the leader) is for the
// checker to judge; Stop has nothing to heal.
func DamageWAL(e *Env, t Target, topic string, partition int32, d Damage) Nemesis {
	name := fmt.Sprintf("%s in the WAL of %s-%d on %s", d, topic, partition, t)
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		if d < TornTail || d > TruncatedSegment {
			return nil, "", nil, fmt.Errorf("nemesis: unknown damage %d", int(d))
		}
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var done []uint64
		var details []string
		detail := func() string { return strings.Join(details, "; ") }
		heal := nothing("nothing to heal: the damage stays")
		for _, id := range ids {
			n, err := e.Cluster.Node(id)
			if err != nil {
				return done, detail(), heal, err
			}
			dir, err := walDir(n.DataDir, topic, partition)
			if err != nil {
				return done, detail(), heal, fmt.Errorf("node %d: %w", id, err)
			}
			wasUp := e.Cluster.Running(id)
			if wasUp {
				if err := e.Cluster.Kill(id); err != nil && !errors.Is(err, cluster.ErrNotRunning) {
					return done, detail(), heal, err
				}
			}
			what, err := damage(e, dir, d)
			details = append(details, fmt.Sprintf("node %d: %s", id, what))
			if wasUp {
				err = errors.Join(err, e.Cluster.StartNode(ctx, id))
			}
			if err != nil {
				return done, detail(), heal, fmt.Errorf("node %d: %w", id, err)
			}
			done = append(done, id)
		}
		return done, detail(), heal, nil
	})
}

// walDir finds the WAL folder of a node's replica of topic's partition:
// DataDir/replicas/<topic>-<p>-<topic id>[-<move id>]/wal in a cluster,
// DataDir/topics/<topic>-<p>/wal on a single node.
func walDir(dataDir, topic string, partition int32) (string, error) {
	own := regexp.MustCompile(fmt.Sprintf(`^%s-%d(-[0-9a-f]{24}(-[0-9a-f]+)?)?$`, regexp.QuoteMeta(topic), partition))
	var found []string
	for _, parent := range []string{"replicas", "topics"} {
		ents, _ := os.ReadDir(filepath.Join(dataDir, parent))
		for _, ent := range ents {
			if !ent.IsDir() || !own.MatchString(ent.Name()) {
				continue
			}
			// On a single node the folder has no topic id; in a cluster it has.
			if (parent == "topics") != (ent.Name() == fmt.Sprintf("%s-%d", topic, partition)) {
				continue
			}
			wal := filepath.Join(dataDir, parent, ent.Name(), "wal")
			if st, err := os.Stat(wal); err == nil && st.IsDir() {
				found = append(found, wal)
			}
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%w: no WAL of %s-%d under %s", ErrNoTarget, topic, partition, dataDir)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%w: several WALs of %s-%d: %v", ErrNoTarget, topic, partition, found)
}

// segments lists a WAL folder's segment files (20-digit names), oldest
// first.
func segments(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ent := range ents {
		if len(ent.Name()) == 20 && !ent.IsDir() {
			out = append(out, filepath.Join(dir, ent.Name()))
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no segment in %s", ErrNoTarget, dir)
	}
	return out, nil
}

// damage does d to the WAL in dir and says what it did.
func damage(e *Env, dir string, d Damage) (string, error) {
	segs, err := segments(dir)
	if err != nil {
		return "", err
	}
	if d == TornTail {
		last := segs[len(segs)-1]
		f, err := os.OpenFile(last, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return "", err
		}
		torn := append([]byte{0xc8, 0x01}, make([]byte, 37)...)
		_, err = f.Write(torn)
		return fmt.Sprintf("appended a torn entry (%d bytes of a 200-byte one) to %s", len(torn), last), errors.Join(err, f.Close())
	}
	seg := segs[(len(segs)-1)/2]
	st, err := os.Stat(seg)
	if err != nil {
		return "", err
	}
	size := st.Size()
	if size < 4 {
		return "", fmt.Errorf("%w: segment %s holds %d bytes, too few to damage", ErrNoTarget, seg, size)
	}
	if d == TruncatedSegment {
		return fmt.Sprintf("cut %s from %d to %d bytes", seg, size, size/2), os.Truncate(seg, size/2)
	}
	f, err := os.OpenFile(seg, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	at := size/4 + int64(e.float()*float64(size/2))
	bit := byte(1) << int(e.float()*8)
	var b [1]byte
	if _, err := f.ReadAt(b[:], at); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	b[0] ^= bit
	if _, err := f.WriteAt(b[:], at); err != nil {
		return "", err
	}
	return fmt.Sprintf("flipped bit %#02x of byte %d of %s (%d bytes)", bit, at, seg, size), f.Sync()
}
