// Package chaos runs a chaos scenario (chaos/scenario) end to end: it
// starts a cluster of real `herald serve` processes (chaos/cluster), runs
// the workload (chaos/workload) while the nemesis applies the scenario's
// faults (chaos/nemesis), heals them, lets the cluster settle and the
// consumers drain, stops the nodes, reads every replica's log offline,
// and checks the whole history (chaos/checker). A run leaves in its
// directory: history.jsonl, report.txt, report.json, timeline.png and the
// nodes' logs and data.
package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/chaos/checker"
	"github.com/heraldmq/herald/chaos/cluster"
	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/nemesis"
	"github.com/heraldmq/herald/chaos/report"
	"github.com/heraldmq/herald/chaos/scenario"
	"github.com/heraldmq/herald/chaos/workload"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Options are one run's settings.
type Options struct {
	Scenario *scenario.Scenario
	// Herald is the herald binary, built with -tags chaos when the
	// scenario has disk or clock faults (they go through /debug/faults).
	Herald string
	Seed   uint64
	// Duration and Nodes override the scenario's when not zero.
	Duration time.Duration
	Nodes    int
	// Out is the run's directory (created; it must not hold a previous
	// run's history).
	Out string
	// Progress receives a line per step of the run; nil = discarded.
	Progress io.Writer
	// ClientLog writes the workload clients' own log (connections,
	// metadata, retries, at debug level) to Out/clients.log.
	ClientLog bool
}

// Result is what a run found.
type Result struct {
	Scenario string
	Seed     uint64
	Ops      int
	Report   checker.Report
	// Goals are the scenario's goals that were missed, in words.
	GoalsMissed []string
	Dir         string
}

// Valid reports whether the checker found no violation.
func (r *Result) Valid() bool { return r.Report.Valid() }

// ErrUnsupported is returned when the scenario needs what this machine
// lacks (network namespaces, root); the message says what.
var ErrUnsupported = cluster.ErrUnsupported

// diskBytes is the tmpfs each node's data dir gets in a disk-full
// scenario.
const diskBytes = 64 << 20

// Run runs one scenario. It returns an error when the run itself could not
// be carried out (the cluster did not start, a fault could not be
// applied); violations of Herald's promises are in the Result's report.
func Run(ctx context.Context, o Options) (*Result, error) {
	s := *o.Scenario
	if o.Duration > 0 {
		s.Duration = scenario.Duration(o.Duration)
	}
	if o.Nodes > 0 {
		s.Nodes = o.Nodes
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "chaos %s: "+format+"\n", append([]any{s.Name}, args...)...)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	hf, err := os.OpenFile(filepath.Join(o.Out, "history.jsonl"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w (use a new --out directory per run)", err)
	}
	defer hf.Close()
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	rec := history.NewRecorder(hf, now)

	ccfg := cluster.Config{Binary: o.Herald, Nodes: s.Nodes, Dir: filepath.Join(o.Out, "nodes"), NetNS: s.NetNS, Args: s.BrokerArgs}
	if s.Uses("disk-full") {
		ccfg.DiskBytes = diskBytes
	}
	say("starting %d nodes", s.Nodes)
	cl, err := cluster.Start(ctx, ccfg)
	if err != nil {
		return nil, err
	}
	defer cl.Stop() // after the final reads: it unmounts tmpfs data dirs
	admin, err := cl.Dial(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	tcfg := &heraldpb.TopicConfig{Partitions: uint32(s.Topic.Partitions), ReplicationFactor: uint32(s.Topic.Replication)}
	if _, err := admin.CreateTopic(ctx, s.Topic.Name, tcfg); err != nil {
		return nil, fmt.Errorf("chaos: creating topic %s: %w", s.Topic.Name, err)
	}

	var clientLog *slog.Logger
	if o.ClientLog {
		f, err := os.Create(filepath.Join(o.Out, "clients.log"))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		clientLog = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	wl, err := workload.Start(ctx, workload.Config{Addrs: cl.Addrs(), Topic: s.Topic.Name, Parts: s.Topic.Partitions, Spec: s.Workload,
		Recorder: rec, Now: now, Seed: o.Seed, Log: slog.New(slog.DiscardHandler), ClientLog: clientLog})
	if err != nil {
		return nil, err
	}
	say("workload running; %s of faults", s.Duration.D())

	env := nemesis.NewEnv(cl, o.Seed, func(ev nemesis.Event) { fmt.Fprintf(progress, "  nemesis: %s\n", ev) })
	var active []nemesis.Nemesis
	var mu sync.Mutex
	plan := s.Plan(o.Seed)
	runErr := func() error {
		for _, st := range plan {
			if err := waitUntil(ctx, start.Add(st.At.D())); err != nil {
				return err
			}
			n, err := build(env, &s, st.Fault)
			if err != nil {
				return err
			}
			mu.Lock()
			active = append(active, n)
			mu.Unlock()
			// The fault's window in the history opens before it is applied
			// and closes once it is healed, so that it covers the fault.
			op := history.Op{Process: "nemesis", F: history.Nemesis, Fault: faultLabel(st.Fault), Type: history.Invoke}
			record(rec, op)
			if err := n.Start(ctx); err != nil {
				op.Type, op.Error = history.Fail, err.Error()
				record(rec, op)
				if errors.Is(err, nemesis.ErrNoTarget) {
					say("skipped %s: %v", n.Name(), err)
					continue
				}
				return fmt.Errorf("chaos: starting %s: %w", n.Name(), err)
			}
			if err := waitUntil(ctx, time.Now().Add(st.For.D())); err != nil {
				return err
			}
			err = n.Stop(ctx)
			op.Type = history.OK
			if err != nil {
				op.Type, op.Error = history.Info, err.Error()
			}
			record(rec, op)
			if err != nil {
				return fmt.Errorf("chaos: healing %s: %w", n.Name(), err)
			}
		}
		return waitUntil(ctx, start.Add(s.Duration.D()))
	}()
	// Heal whatever is still on, whatever happened.
	hctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range active {
		if err := n.Stop(hctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("chaos: healing %s: %w", n.Name(), err)
		}
	}
	if runErr != nil {
		wl.Stop(hctx)
		return nil, runErr
	}

	if tail := s.Goals.Recovery.D(); tail > 0 {
		// The workload runs on past the heal for the recovery goal and a
		// second: a fault the schedule's end healed (random-process seed
		// 3's last kill ended 2 ms after the last write) is judged on its
		// recovery too, not missed for want of writes after it.
		say("faults over; writing on for %s", tail+time.Second)
		if err := waitUntil(ctx, time.Now().Add(tail+time.Second)); err != nil {
			wl.Stop(hctx)
			return nil, err
		}
	}
	say("faults over; settling for up to %s", s.Settle.D())
	wl.StopGenerators()
	drained, waiting := settle(ctx, cl, wl.DLQCaughtUp, &s, now)
	if !drained {
		say("not drained: %s", waiting)
	}
	// Settling may take longer than the heal's minute (a clock fault
	// adds its offset): the workload and the nodes get their own.
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if errs := wl.Stop(wctx); len(errs) > 0 {
		say("workload errors: %v", errs)
	}
	say("stopping the nodes")
	for _, id := range cl.IDs() {
		if cl.Running(id) {
			sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cl.Shutdown(sctx, id)
			scancel()
			if err != nil {
				say("stopping node %d: %v", id, err)
			}
		}
	}
	dirs := map[int]string{}
	for _, n := range cl.Nodes() {
		dirs[int(n.ID)] = n.DataDir
	}
	reads, err := finalReads(dirs, s.Topic.Name, filepath.Join(o.Out, "reads"))
	if err != nil {
		return nil, err
	}
	for _, r := range reads {
		if _, err := rec.Record(r); err != nil {
			return nil, err
		}
	}
	if err := rec.Err(); err != nil {
		return nil, err
	}
	if err := hf.Close(); err != nil {
		return nil, err
	}
	ops, err := readHistory(filepath.Join(o.Out, "history.jsonl"))
	if err != nil {
		return nil, err
	}
	// Delays and due times travel in milliseconds (DeliverAt, not_before_ms):
	// a due time rounded down to its millisecond may be up to 1 ms before
	// the client's, which it measured in nanoseconds before sending.
	rep := checker.Check(ops, checker.Options{Drained: drained, Grace: 2 * time.Second, EarlyTolerance: time.Millisecond})
	res := &Result{Scenario: s.Name, Seed: o.Seed, Ops: len(ops), Report: rep, Dir: o.Out, GoalsMissed: goals(&s, rep)}
	return res, writeReport(o.Out, &s, res, ops)
}

func waitUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// record writes op to the history; a failed write sticks in the
// Recorder and fails the run when the history is read back.
func record(rec *history.Recorder, op history.Op) { _, _ = rec.Record(op) }

// build makes the nemesis of one fault of s.
func build(e *nemesis.Env, s *scenario.Scenario, f scenario.Fault) (nemesis.Nemesis, error) {
	t, err := target(s, f.Target)
	if err != nil {
		return nil, err
	}
	topic := s.Topic.Name
	switch f.Kind {
	case "kill":
		return nemesis.Kill(e, t), nil
	case "pause":
		return nemesis.Pause(e, t), nil
	case "rolling-restart":
		return nemesis.RollingRestart(e, false), nil
	case "isolate", "partition-minority":
		if f.Target == "random" || f.Target == "minority" {
			return nemesis.CutMinority(e), nil
		}
		return nemesis.Isolate(e, t), nil
	case "partition-majority":
		return nemesis.SplitMajority(e), nil
	case "bridge":
		return nemesis.Bridge(e), nil
	case "flap":
		return nemesis.Flap(e, t, time.Second), nil
	case "slow-disk":
		return nemesis.SlowDisk(e, t, f.Delay.D()), nil
	case "fsync-eio":
		return nemesis.FsyncError(e, t, 0), nil
	case "disk-full":
		return nemesis.DiskFull(e, t), nil
	case "torn-tail":
		return nemesis.DamageWAL(e, t, topic, 0, nemesis.TornTail), nil
	case "bitflip":
		return nemesis.DamageWAL(e, t, topic, 0, nemesis.BitFlip), nil
	case "truncate-segment":
		return nemesis.DamageWAL(e, t, topic, 0, nemesis.TruncatedSegment), nil
	case "clock-jump":
		return nemesis.ClockJump(e, t, f.Offset.D()), nil
	case "scheduler-clock-step":
		return nemesis.SteppedScheduler(e, f.Offset.D()), nil
	case "add-node":
		return nemesis.AddNode(e), nil
	case "remove-node":
		return nemesis.RemoveNode(e, nemesis.NonVoter()), nil
	case "move-replicas":
		return nemesis.Rebalance(e), nil
	}
	return nil, fmt.Errorf("chaos: no nemesis for fault kind %q", f.Kind)
}

// target maps a scenario's target name to the nemesis's.
func target(s *scenario.Scenario, name string) (nemesis.Target, error) {
	switch name {
	case "random", "all", "":
		return nemesis.AnyNode(), nil
	case "leader":
		return nemesis.PartitionLeader(s.Topic.Name, 0), nil
	case "follower":
		return nemesis.PartitionFollower(s.Topic.Name, 0), nil
	case "leader-not-scheduler":
		return nemesis.LeaderNotLeading(s.Topic.Name, int32(s.Topic.Partitions), "__schedule"), nil
	case "controller":
		return nemesis.ControllerLeader(), nil
	case "txn-coordinator":
		return nemesis.PartitionLeader("__txn", 0), nil
	case "majority":
		return nemesis.Majority(), nil
	case "minority":
		return nemesis.Minority(), nil
	}
	var n uint64
	if _, err := fmt.Sscanf(name, "node:%d", &n); err == nil {
		return nemesis.Nodes(n), nil
	}
	return nemesis.Target{}, fmt.Errorf("chaos: unknown target %q", name)
}

// settle waits, up to the scenario's Settle, until the cluster is settled,
// every delayed message is due, every half message is ended, and every
// group has acked everything in the log; it reports whether it got there
// (the run drained). Then it waits for the dead-letter readers to read
// everything appended until the groups were done (dlqCaughtUp).
func settle(ctx context.Context, cl *cluster.Cluster, dlqCaughtUp func(since time.Time) bool, s *scenario.Scenario, now func() time.Duration) (drained bool, waiting string) {
	// A node whose clock ran ahead scheduled its delayed messages that
	// much later in real time: wait for them too.
	deadline := time.Now().Add(s.Settle.D() + s.MaxClockOffset())
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if cl.Settle(sctx) != nil {
		return false, "the cluster to settle (leaders, replicas caught up)"
	}
	lastDue := time.Duration(0)
	if d := s.Workload.Delayed; d != nil {
		lastDue = now() + d.Delay.D() // every delayed message was sent before now
	}
	c, err := cl.Dial(sctx)
	if err != nil {
		return false, "a connection: " + err.Error()
	}
	defer c.Close()
	for {
		checked := time.Now()
		switch {
		case now() < lastDue:
			waiting = "the last delayed message's time"
		default:
			waiting = schedulesPending(sctx, cl)
			if waiting == "" {
				waiting = groupsPending(sctx, c, s)
			}
		}
		if waiting == "" {
			for !dlqCaughtUp(checked) {
				if waitUntil(sctx, time.Now().Add(100*time.Millisecond)) != nil {
					return false, "the dead-letter readers"
				}
			}
			return true, ""
		}
		if waitUntil(sctx, time.Now().Add(200*time.Millisecond)) != nil {
			return false, waiting
		}
	}
}

// schedulesPending names what a node still holds, "" if none does: a
// delayed message not yet appended (herald_scheduler_pending), a batch
// held unreadable until its time (herald_partition_held_batches), a half
// message not yet on its topic or rolled back (herald_txn_half_pending),
// or a committed transaction whose records are still being appended
// (herald_txn_committing).
func schedulesPending(ctx context.Context, cl *cluster.Cluster) string {
	for _, n := range cl.Nodes() {
		if !cl.Running(n.ID) {
			continue
		}
		for _, m := range []string{"herald_scheduler_pending", "herald_partition_held_batches", "herald_txn_half_pending", "herald_txn_committing"} {
			v, err := metricSum(ctx, n.Admin, m)
			if err != nil {
				return fmt.Sprintf("node %d's %s: %v", n.ID, m, err)
			}
			if v > 0 {
				return fmt.Sprintf("node %d: %s %v", n.ID, m, v)
			}
		}
	}
	return ""
}

// metricSum adds up every sample of metric on the node's /metrics.
func metricSum(ctx context.Context, admin, metric string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric) {
			continue
		}
		rest := line[len(metric):]
		if rest == "" || rest[0] != ' ' && rest[0] != '{' {
			continue // another metric whose name starts the same
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// groupsPending names a group of s that has not acked every record, ""
// if none.
func groupsPending(ctx context.Context, c interface {
	DescribeGroup(context.Context, string) (*heraldpb.GroupInfo, error)
}, s *scenario.Scenario) string {
	for _, g := range s.Workload.Groups {
		info, err := c.DescribeGroup(ctx, g.Name)
		if err != nil {
			return fmt.Sprintf("group %s: %v", g.Name, err)
		}
		if info.GetInFlight() > 0 || info.GetRetrying() > 0 {
			return fmt.Sprintf("group %s: %d in flight, %d retrying", g.Name, info.GetInFlight(), info.GetRetrying())
		}
		for _, p := range info.GetPartitions() {
			if p.GetAckFloor() < p.GetHighWatermark() {
				return fmt.Sprintf("group %s: partition %d acked to %d of %d", g.Name, p.GetPartition(), p.GetAckFloor(), p.GetHighWatermark())
			}
		}
	}
	return ""
}

func readHistory(path string) ([]history.Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return history.Read(f)
}

// goals lists the scenario's goals the report shows missed: for each
// fault, the longest stretch without an acknowledged write while it was on
// (and Grace after) and the longest time from its end to the next one.
//
// A split that leaves no side a majority (partition-majority), or a
// majority of the nodes killed or paused, stops every write by design, as
// it does in any system that commits to a quorum: only its recovery is
// judged.
func goals(s *scenario.Scenario, rep checker.Report) []string {
	var missed []string
	for _, f := range rep.Availability.Faults {
		if g := s.Goals.Unavailable.D(); g > 0 && f.Longest.Len() > g && !noQuorum[f.Fault] {
			missed = append(missed, fmt.Sprintf("%s: writes stopped for %v (goal %v)", f.Fault, f.Longest.Len().Round(time.Millisecond), g))
		}
		if g := s.Goals.Recovery.D(); g > 0 && f.MaxRecovery > g {
			missed = append(missed, fmt.Sprintf("%s: writes resumed %v after it ended (goal %v)", f.Fault, f.MaxRecovery.Round(time.Millisecond), g))
		}
		if f.Unrecovered > 0 && s.Goals.Recovery > 0 {
			missed = append(missed, fmt.Sprintf("%s: %d ends with no write after them", f.Fault, f.Unrecovered))
		}
	}
	return missed
}

// noQuorum names the faults under which no side holds a majority: a
// split with no majority, and a majority of the nodes killed or paused.
var noQuorum = map[string]bool{"partition-majority": true, "kill majority": true, "pause majority": true}

// faultLabel is a fault's name in the history and the availability
// figures: its kind, and "majority" after it when it takes a majority
// of the nodes down (judged apart: see goals).
func faultLabel(f scenario.Fault) string {
	if f.Target == "majority" && (f.Kind == "kill" || f.Kind == "pause") {
		return f.Kind + " majority"
	}
	return f.Kind
}

// writeReport writes report.txt, report.json and timeline.png.
func writeReport(dir string, s *scenario.Scenario, res *Result, ops []history.Op) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s (seed %d): %s\n%d ops\n\n", s.Name, res.Seed, s.Description, res.Ops)
	b.WriteString(res.Report.String())
	if len(res.GoalsMissed) > 0 {
		b.WriteString("\ngoals missed:\n")
		for _, g := range res.GoalsMissed {
			fmt.Fprintf(&b, "  - %s\n", g)
		}
	} else if s.Goals != (scenario.Goals{}) {
		fmt.Fprintf(&b, "\ngoals met: writes stopped at most %v per fault, resumed within %v of its end\n", s.Goals.Unavailable.D(), s.Goals.Recovery.D())
	}
	if err := os.WriteFile(filepath.Join(dir, "report.txt"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), js, 0o644); err != nil {
		return err
	}
	samples, windows := timelineOf(ops)
	f, err := os.Create(filepath.Join(dir, "timeline.png"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := report.Timeline(f, fmt.Sprintf("%s, seed %d", s.Name, res.Seed), samples, windows); err != nil && !errors.Is(err, report.ErrNoSamples) {
		return err
	}
	return f.Close()
}
