package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// ctlLog is the controller log as a node's /cluster shows it.
type ctlLog struct {
	Leader          uint64 `json:"leader"`
	Applied         int64  `json:"applied"`
	LogStart        int64  `json:"log_start"`
	Checkpoint      int64  `json:"checkpoint"`
	SinceCheckpoint int64  `json:"since_checkpoint"`
	CheckpointError string `json:"checkpoint_error"`
}

func getCtlLog(p *proc) (ctlLog, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.AdminAddr() + "/cluster")
	if err != nil {
		return ctlLog{}, err
	}
	defer resp.Body.Close()
	var v struct {
		Controller ctlLog `json:"controller"`
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Controller, err
}

// userTopics lists the topics a node serves, internal ones left out.
func userTopics(t *testing.T, p *proc) ([]string, error) {
	c, err := client.Dial(ctxT(t, 5*time.Second), p.Addr())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ts, err := c.ListTopics(ctxT(t, 5*time.Second))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ti := range ts {
		out = append(out, ti.Name)
	}
	slices.Sort(out)
	return out, nil
}

// snapshotLine is a node's log line when its controller replica installs
// a raft snapshot.
var snapshotLine = regexp.MustCompile(`persistence: installed snapshot" group=__controller-0 .*next_offset=(\d+)`)

// TestControllerCheckpoints: with a checkpoint every 8 records, topic
// creations and deletions make the controller group's leader write
// checkpoints, and every node truncates its controller log before the last
// one. A node killed meanwhile falls behind the others' truncated logs: on
// restart it gets a raft snapshot, reads its log from the checkpoint it
// starts at, and shows every topic. A node restarted gracefully replays its
// truncated log and shows every topic. Finally every node's controller log,
// read from disk, starts at a checkpoint stored at the offset it names, and
// replaying it gives the topics. A node added afterwards joins the
// controller group as a learner from a snapshot and shows every topic.
func TestControllerCheckpoints(t *testing.T) {
	const every = 8
	tc := startCluster(t, 3, "--controller-checkpoint-records", strconv.Itoa(every))
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := map[string]bool{}
	churn := func(round string, create, del int) {
		t.Helper()
		for i := range create {
			name := fmt.Sprintf("%s-%02d", round, i)
			checkFor(t, 30*time.Second, "creating "+name, func() error {
				_, err := c.CreateTopic(ctxT(t, 15*time.Second), name, &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 1})
				if isCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
					return nil // an earlier try got through
				}
				return err
			})
			want[name] = true
		}
		for i := range del {
			name := fmt.Sprintf("%s-%02d", round, i*2)
			checkFor(t, 30*time.Second, "deleting "+name, func() error {
				err := c.DeleteTopic(ctxT(t, 15*time.Second), name)
				if isCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
					return nil
				}
				return err
			})
			delete(want, name)
		}
	}
	wantList := func() []string { return slices.Sorted(maps.Keys(want)) }
	// compacted waits until every node in live applied a checkpoint past
	// offset after, truncated its log there, and has applied fewer than
	// every records since (the leader keeps up).
	compacted := func(what string, live map[uint64]*proc, after int64) map[uint64]ctlLog {
		t.Helper()
		out := map[uint64]ctlLog{}
		checkFor(t, 30*time.Second, what, func() error {
			for id, p := range live {
				v, err := getCtlLog(p)
				if err != nil {
					return err
				}
				if v.Checkpoint <= after || v.LogStart != v.Checkpoint || v.SinceCheckpoint >= every || v.CheckpointError != "" {
					return fmt.Errorf("node %d: %+v", id, v)
				}
				out[id] = v
			}
			return nil
		})
		return out
	}
	sameTopics := func(what string, p *proc) {
		t.Helper()
		checkFor(t, 30*time.Second, what, func() error {
			got, err := userTopics(t, p)
			if err != nil {
				return err
			}
			if !slices.Equal(got, wantList()) {
				return fmt.Errorf("topics %v, want %v", got, wantList())
			}
			return nil
		})
	}

	churn("a", 14, 4)
	first := compacted("checkpoints after the first round", tc.nodes, 0)
	checkFor(t, 10*time.Second, "the metrics show the checkpoint", func() error {
		written := 0.0
		for id, p := range tc.nodes {
			written += metricSum(t, p, "herald_controller_checkpoints_written_total")
			v, err := getCtlLog(p)
			if err != nil {
				return err
			}
			if s := metricSum(t, p, "herald_controller_log_start_offset"); s <= 0 || s != float64(v.LogStart) {
				return fmt.Errorf("node %d: herald_controller_log_start_offset is %v, its log starts at %d", id, s, v.LogStart)
			}
		}
		if written < 1 {
			return fmt.Errorf("no checkpoint written")
		}
		return nil
	})

	// Node 3 down while the others write and truncate well past its log.
	down := tc.nodes[3]
	v3, err := getCtlLog(down)
	if err != nil {
		t.Fatal(err)
	}
	down.Kill(t)
	live := map[uint64]*proc{1: tc.nodes[1], 2: tc.nodes[2]}
	churn("b", 20, 5)
	compacted("the live nodes truncated past node 3's log", live, v3.Applied+1)
	down.Start(t)
	sameTopics("node 3 back, with every topic", down)
	compacted("node 3 caught up", tc.nodes, first[1].Checkpoint)
	snapAt := int64(-1)
	for _, m := range snapshotLine.FindAllStringSubmatch(down.logs(), -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		snapAt = max(snapAt, n)
	}
	if snapAt <= v3.Applied {
		t.Fatalf("node 3 (at %d when killed) did not install a raft snapshot past that: last at %d", v3.Applied, snapAt)
	}

	// A graceful restart replays the truncated log.
	tc.nodes[1].Stop(t)
	tc.nodes[1].Start(t)
	churn("c", 3, 1)
	for id, p := range tc.nodes {
		sameTopics(fmt.Sprintf("node %d, every topic", id), p)
	}
	compacted("after the restarts", tc.nodes, first[1].Checkpoint)

	// A new node joins: the leader adds it as a learner of the controller
	// group, whose log starts at a checkpoint, so it gets a snapshot too.
	tc.add(t, 4)
	sameTopics("node 4, every topic", tc.nodes[4])
	compacted("node 4 joined", tc.nodes, first[1].Checkpoint)

	c.Close()
	for _, id := range []uint64{1, 2, 3, 4} {
		tc.nodes[id].Stop(t)
		if l := tc.nodes[id].logs(); strings.Contains(l, "is not a checkpoint") || strings.Contains(l, "undecodable controller") {
			t.Fatalf("node %d's controller read a log that does not resume at a checkpoint, or a bad record", id)
		}
	}
	for _, id := range []uint64{1, 2, 3, 4} {
		start, cp, topics := readControllerLog(t, tc.nodes[id].DataDir())
		if start == 0 || cp != start {
			t.Fatalf("node %d: the controller log starts at %d with a checkpoint of offset %d", id, start, cp)
		}
		if !slices.Equal(topics, wantList()) {
			t.Fatalf("node %d: the controller log on disk gives topics %v, want %v", id, topics, wantList())
		}
	}
}

// readControllerLog opens a stopped node's controller log and returns the
// offset it starts at, the offset named by the checkpoint stored there (-1
// if the first record is not a checkpoint), and the user topics replaying
// the log gives.
func readControllerLog(t *testing.T, dataDir string) (int64, int64, []string) {
	t.Helper()
	log, err := persistence.Open(persistence.Options{Dir: filepath.Join(dataDir, "controller"), Group: "__controller-0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	start, cp := log.StartOffset(), int64(-1)
	topics := map[string]bool{}
	for off := start; off < log.EndOffset(); {
		batches, err := log.ReadBatches(off, 1<<20, log.EndOffset())
		if err != nil || len(batches) == 0 {
			t.Fatalf("reading the controller log at %d: %v", off, err)
		}
		for _, b := range batches {
			err := heraldpb.ForEachRawRecord(b.Records, func(i int, raw []byte) bool {
				at := b.BaseOffset + int64(i)
				var r heraldpb.Record
				var cmd heraldpb.ControllerCommand
				if err := proto.Unmarshal(raw, &r); err != nil {
					t.Fatalf("record at %d: %v", at, err)
				}
				if err := proto.Unmarshal(r.Value, &cmd); err != nil {
					t.Fatalf("command at %d: %v", at, err)
				}
				switch {
				case cmd.GetCheckpoint() != nil && cmd.GetCheckpoint().Offset == at:
					if at == start {
						cp = at
					}
					clear(topics)
					for _, tr := range cmd.GetCheckpoint().Topics {
						topics[tr.Name] = true
					}
				case cmd.GetCreateTopic() != nil:
					topics[cmd.GetCreateTopic().Name] = true
				case cmd.GetDeleteTopic() != nil:
					delete(topics, cmd.GetDeleteTopic().Name)
				}
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			off = b.BaseOffset + int64(b.Count)
		}
	}
	var out []string
	for name := range topics {
		if !strings.HasPrefix(name, "__") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return start, cp, out
}
