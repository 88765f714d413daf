package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// produceN sends n records to topic with values "<prefix>-<i>" (zero
// padded) and keys "k<i%keys>", acks=all, and waits for all.
func produceN(t *testing.T, c *client.Client, topic, prefix string, n, keys int) {
	t.Helper()
	if err := produceErr(c, topic, prefix, n, keys); err != nil {
		t.Fatal(err)
	}
}

func produceErr(c *client.Client, topic, prefix string, n, keys int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := c.NewProducer(client.WithLinger(time.Millisecond))
	var failed atomic.Int64
	for i := 0; i < n; i++ {
		p.SendAsync(ctx, &client.Message{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%keys)), Value: []byte(fmt.Sprintf("%s-%06d", prefix, i))},
			func(_ client.Result, err error) {
				if err != nil {
					failed.Add(1)
				}
			})
	}
	if err := p.Close(ctx); err != nil || failed.Load() > 0 {
		return fmt.Errorf("produce: %v (%d failed)", err, failed.Load())
	}
	return nil
}

// seenSet records deliveries by value, safe for concurrent handlers.
type seenSet struct {
	mu   sync.Mutex
	n    map[string]int
	by   map[string]map[string]bool // member -> values
	keys map[string][]int           // key -> sequence numbers in delivery order (first deliveries)
}

func newSeen() *seenSet {
	return &seenSet{n: map[string]int{}, by: map[string]map[string]bool{}, keys: map[string][]int{}}
}

func (s *seenSet) add(member string, m *client.Delivered) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := string(m.Value)
	s.n[v]++
	if s.by[member] == nil {
		s.by[member] = map[string]bool{}
	}
	s.by[member][v] = true
	if m.DeliveryCount == 1 {
		seq, _ := strconv.Atoi(v[strings.LastIndexByte(v, '-')+1:])
		s.keys[string(m.Key)] = append(s.keys[string(m.Key)], seq)
	}
}

func (s *seenSet) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.n)
}

func (s *seenSet) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := 0
	for _, c := range s.n {
		t += c
	}
	return t
}

func subscribeT(t *testing.T, c *client.Client, opts client.SubscribeOptions, h client.Handler) *client.Subscription {
	t.Helper()
	sub, err := c.Subscribe(ctxT(t, 10*time.Second), opts, h)
	if err != nil {
		t.Fatalf("subscribe %+v: %v", opts, err)
	}
	t.Cleanup(func() { sub.Close(context.Background()) })
	return sub
}

func createTopic(t *testing.T, c *client.Client, name string, parts uint32) {
	t.Helper()
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), name, &heraldpb.TopicConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
}

// Clustering: members' deliveries are disjoint and cover every message;
// partitions move on join and leave.
func TestClusteringDisjointAndRebalance(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "orders", 4)
	seen := newSeen()
	opts := func(name string) client.SubscribeOptions {
		return client.SubscribeOptions{Group: "billing", Topic: "orders", Mode: client.Clustering, From: client.Earliest(), Name: name, Window: 64}
	}
	handler := func(name string) client.Handler {
		return func(_ context.Context, m *client.Delivered) { seen.add(name, m) }
	}
	a := subscribeT(t, dial(t, n), opts("a"), handler("a"))
	b := subscribeT(t, dial(t, n), opts("b"), handler("b"))
	checkFor(t, 10*time.Second, "two members with two partitions each", func() error {
		if la, lb := len(a.Assigned()), len(b.Assigned()); la != 2 || lb != 2 {
			return fmt.Errorf("assigned a=%v b=%v", a.Assigned(), b.Assigned())
		}
		return nil
	})
	produceN(t, c, "orders", "m1", 2000, 50)
	checkFor(t, 20*time.Second, "2000 delivered", func() error {
		if d := seen.distinct(); d != 2000 {
			return fmt.Errorf("%d distinct", d)
		}
		return nil
	})
	// A third member joins: each keeps at least one partition, none shared.
	cc := subscribeT(t, dial(t, n), opts("c"), handler("c"))
	checkFor(t, 10*time.Second, "rebalance to three members", func() error {
		all := append(append(append([]int32{}, a.Assigned()...), b.Assigned()...), cc.Assigned()...)
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		if len(cc.Assigned()) == 0 || fmt.Sprint(all) != "[0 1 2 3]" {
			return fmt.Errorf("assigned a=%v b=%v c=%v", a.Assigned(), b.Assigned(), cc.Assigned())
		}
		return nil
	})
	produceN(t, c, "orders", "m2", 2000, 50)
	// b leaves cleanly: its partitions go to a and c.
	if err := b.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	produceN(t, c, "orders", "m3", 2000, 50)
	checkFor(t, 30*time.Second, "6000 delivered", func() error {
		if d := seen.distinct(); d != 6000 {
			return fmt.Errorf("%d distinct", d)
		}
		return nil
	})
	// Nothing failed, so nothing was redelivered: deliveries are disjoint.
	if tot := seen.total(); tot != 6000 {
		t.Fatalf("%d deliveries for 6000 messages: members overlapped", tot)
	}
	for v := range seen.by["b"] {
		if seen.by["a"][v] || seen.by["c"][v] {
			t.Fatalf("%s went to b and another member", v)
		}
	}
	// The SDK acks after the handler returns, in batches: the last acks
	// reach the coordinator shortly after the last delivery was counted.
	checkFor(t, 10*time.Second, "no lag once the last acks land", func() error {
		info, err := c.DescribeGroup(ctxT(t, 5*time.Second), "billing")
		if err != nil || len(info.Members) != 2 {
			return fmt.Errorf("describe: %v %v", info, err)
		}
		for _, p := range info.Partitions {
			if p.Lag != 0 {
				return fmt.Errorf("partition %d lag %d", p.Partition, p.Lag)
			}
		}
		return nil
	})
}

// Shared and key-shared with more consumers than partitions: nothing is
// lost, and in key-shared mode per-key order holds.
func TestSharedAndKeySharedMoreConsumersThanPartitions(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "events", 2)
	for _, mode := range []client.SubscriptionMode{client.Shared, client.KeyShared} {
		t.Run(mode.String(), func(t *testing.T) {
			seen := newSeen()
			group := "g-" + mode.String()
			var subs []*client.Subscription
			for i := 0; i < 5; i++ {
				name := fmt.Sprintf("m%d", i)
				subs = append(subs, subscribeT(t, dial(t, n), client.SubscribeOptions{
					Group: group, Topic: "events", Mode: mode, Name: name, Window: 16, Concurrency: 4,
				}, func(_ context.Context, m *client.Delivered) {
					time.Sleep(100 * time.Microsecond)
					seen.add(name, m)
				}))
			}
			waitMembers(t, c, group, 5, 10*time.Second)
			produceN(t, c, "events", group, 3000, 40)
			checkFor(t, 30*time.Second, "3000 delivered", func() error {
				if d := seen.distinct(); d != 3000 {
					return fmt.Errorf("%d distinct", d)
				}
				return nil
			})
			busy := 0
			for _, vs := range seen.by {
				if len(vs) > 0 {
					busy++
				}
			}
			if busy < 3 {
				t.Fatalf("only %d of 5 members got messages (2 partitions)", busy)
			}
			if mode == client.KeyShared {
				seen.mu.Lock()
				for k, seqs := range seen.keys {
					if !sort.IntsAreSorted(seqs) {
						t.Fatalf("key %s delivered out of order: %v", k, seqs)
					}
				}
				seen.mu.Unlock()
			}
			for _, s := range subs {
				s.Close(ctxT(t, 10*time.Second))
			}
		})
	}
}

// A subscriber that granted 10 credits never holds more than 10 unacked.
func TestCreditsBoundInFlight(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "slow", 1)
	produceN(t, c, "slow", "s", 200, 1)
	release := make(chan struct{})
	var held atomic.Int64
	sub := subscribeT(t, dial(t, n), client.SubscribeOptions{Group: "slow", Topic: "slow", Mode: client.Shared, From: client.Earliest(), Window: 10, Concurrency: 20},
		func(_ context.Context, m *client.Delivered) {
			held.Add(1)
			<-release
		})
	checkFor(t, 10*time.Second, "10 messages held", func() error {
		if h := held.Load(); h != 10 {
			return fmt.Errorf("%d held", h)
		}
		return nil
	})
	for i := 0; i < 20; i++ { // the broker must not push more meanwhile
		info, err := c.DescribeGroup(ctxT(t, 5*time.Second), "slow")
		if err != nil {
			t.Fatal(err)
		}
		if info.InFlight > 10 || held.Load() > 10 || sub.Stats().InFlight > 10 {
			t.Fatalf("in flight: broker %d, handlers %d, client %d; granted 10", info.InFlight, held.Load(), sub.Stats().InFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	checkFor(t, 10*time.Second, "all 200 handled", func() error {
		if h := held.Load(); h != 200 {
			return fmt.Errorf("%d handled", h)
		}
		return nil
	})
}

// Replay: a group starts from an offset or a time, and reset moves it.
func TestReplayByOffsetAndTime(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "log", 1)
	produceN(t, c, "log", "a", 100, 1)
	// Append times are in milliseconds: mid must fall in a later
	// millisecond than the last "a" batch's, and before the first "b" one.
	time.Sleep(5 * time.Millisecond)
	mid := time.Now()
	time.Sleep(5 * time.Millisecond)
	produceN(t, c, "log", "b", 100, 1)
	first := func(group string, from client.StartPosition) string {
		got := make(chan string, 1000)
		sub := subscribeT(t, dial(t, n), client.SubscribeOptions{Group: group, Topic: "log", Mode: client.Shared, From: from},
			func(_ context.Context, m *client.Delivered) { got <- fmt.Sprintf("%d:%s", m.Offset, m.Value) })
		defer sub.Close(ctxT(t, 10*time.Second))
		select {
		case v := <-got:
			return v
		case <-time.After(10 * time.Second):
			t.Fatalf("group %s got nothing", group)
			return ""
		}
	}
	if v := first("by-offset", client.AtOffset(42)); v != "42:a-000042" {
		t.Fatalf("from offset 42: first %s", v)
	}
	if v := first("by-time", client.AtTime(mid)); v != "100:b-000000" {
		t.Fatalf("from %v: first %s", mid, v)
	}
	if _, err := c.ResetGroup(ctxT(t, 10*time.Second), "by-offset", client.AtOffset(7), false); err != nil {
		t.Fatal(err)
	}
	if v := first("by-offset", client.Latest()); v != "7:a-000007" {
		t.Fatalf("after reset to 7: first %s", v)
	}
}

// Request-reply through a broker process: round trips to a shared group of
// responders, timeout and cancellation.
func TestRequestReply(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "echo", 1)
	var served [2]atomic.Int64
	for i := range served {
		rc := dial(t, n)
		if _, err := rc.Respond(ctxT(t, 10*time.Second), "echo", "echo-service", func(_ context.Context, req *client.Delivered) (*client.Message, error) {
			served[i].Add(1)
			if string(req.Value) == "slow" {
				time.Sleep(2 * time.Second)
			}
			return &client.Message{Value: append([]byte("re:"), req.Value...)}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitMembers(t, c, "echo-service", 2, 10*time.Second)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				q := fmt.Sprintf("q%d-%d", w, i)
				r, err := c.Request(ctxT(t, 5*time.Second), "echo", &client.Message{Value: []byte(q)})
				if err != nil || string(r.Value) != "re:"+q {
					bad.Add(1)
					t.Errorf("request %s: %v %v", q, r, err)
				}
			}
		}(w)
	}
	wg.Wait()
	if bad.Load() > 0 || served[0].Load() == 0 || served[1].Load() == 0 {
		t.Fatalf("%d bad replies; served %d and %d (both responders should serve)", bad.Load(), served[0].Load(), served[1].Load())
	}
	// Timeout: the responder is slow.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := c.Request(ctx, "echo", &client.Message{Value: []byte("slow")})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("slow request: %v after %v", err, time.Since(start))
	}
	// Cancellation.
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	start = time.Now()
	_, err = c.Request(ctx, "echo", &client.Message{Value: []byte("slow")})
	if !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Fatalf("cancelled request: %v after %v", err, time.Since(start))
	}
	// No responders on another topic.
	createTopic(t, c, "nobody", 1)
	if _, err := c.Request(ctxT(t, 5*time.Second), "nobody", &client.Message{Value: []byte("x")}); !isCode(err, heraldpb.ErrorCode_NO_RESPONDERS) {
		t.Fatalf("request without responders: %v", err)
	}
}

func isCode(err error, code heraldpb.ErrorCode) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Code == code
}

// consumerProc is a `herald consume --group` process writing the values it
// acked to a file.
type consumerProc struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{} // closed when the process exited
}

func startConsumer(t *testing.T, addr string, args ...string) *consumerProc {
	return startConsumerOut(t, addr, nil, args...)
}

// startConsumerOut starts a consumer whose stdout is stdout (nil: a file
// that lines reads).
func startConsumerOut(t *testing.T, addr string, stdout *os.File, args ...string) *consumerProc {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	f := stdout
	if f == nil {
		var err error
		if f, err = os.Create(out); err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	cmd := exec.Command(heraldBin, append([]string{"consume", "--addr", addr}, args...)...)
	cmd.Stdout = f
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &consumerProc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("consumer %s stderr:\n%s", args, stderr.String())
		}
	})
	return p
}

func (p *consumerProc) lines(t *testing.T) []string {
	f, err := os.Open(p.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// Three `herald consume --group` processes and one producer; one consumer
// is SIGKILLed mid-stream: its unacked messages go to the others, none is
// lost, and the group rebalances to two members (in clustering mode the
// victim, the first to join, owns a partition, which moves).
func TestConsumerProcessKilled(t *testing.T) {
	for _, mode := range []string{"shared", "clustering"} {
		t.Run(mode, func(t *testing.T) { consumerProcessKilled(t, mode) })
	}
}

func consumerProcessKilled(t *testing.T, mode string) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "jobs", 2)
	// The victim prints into a 4 KiB pipe nobody reads until it is killed:
	// it gets stuck printing, holding its window of messages unacked, as a
	// hung consumer does.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, pw.Fd(), 1031 /* F_SETPIPE_SZ */, 4096); e != 0 {
		t.Fatalf("F_SETPIPE_SZ: %v", e)
	}
	var cons []*consumerProc
	for i := 0; i < 3; i++ {
		args := []string{"--topic", "jobs", "--group", "workers", "--mode", mode, "--window", "32", "--name", fmt.Sprintf("w%d", i), "--ack-timeout", "30s"}
		if i == 0 {
			cons = append(cons, startConsumerOut(t, n.Addr(), pw, args...))
			pw.Close()
			// It joins first, so in clustering mode it keeps a partition.
			waitMembers(t, c, "workers", 1, 20*time.Second)
		} else {
			cons = append(cons, startConsumer(t, n.Addr(), args...))
		}
	}
	waitMembers(t, c, "workers", 3, 20*time.Second)
	const total = 6000
	// Produce at a pace (60 batches over about a second), so the victim
	// dies mid-stream with messages in flight.
	produced := make(chan error, 1)
	go func() {
		for i := 0; i < total/100; i++ {
			if err := produceErr(c, "jobs", fmt.Sprintf("job%02d", i), 100, 100); err != nil {
				produced <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		produced <- nil
	}()
	victimState := func() (inFlight uint32, delivered uint64) {
		info, err := c.DescribeGroup(ctxT(t, 5*time.Second), "workers")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range info.Members {
			if m.Name == "w0" {
				return m.InFlight, m.Delivered
			}
		}
		return 0, 0
	}
	checkFor(t, 30*time.Second, "the victim stuck with its window unacked", func() error {
		f1, d1 := victimState()
		time.Sleep(50 * time.Millisecond) // no progress over this long: stuck
		f2, d2 := victimState()
		if f1 != 32 || f2 != 32 || d1 != d2 {
			return fmt.Errorf("victim in flight %d then %d, delivered %d then %d", f1, f2, d1, d2)
		}
		return nil
	})
	cons[0].cmd.Process.Kill()
	<-cons[0].done
	victim, err := io.ReadAll(pr) // what it printed (and so acked) before it hung
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("victim printed %d lines", len(strings.Fields(string(victim))))
	waitMembers(t, c, "workers", 2, 20*time.Second)
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	checkFor(t, 60*time.Second, "every job printed", func() error {
		clear(count)
		for _, l := range strings.Fields(string(victim)) {
			count[l]++
		}
		for _, p := range cons[1:] {
			for _, l := range p.lines(t) {
				count[l]++
			}
		}
		if len(count) != total {
			return fmt.Errorf("%d of %d distinct", len(count), total)
		}
		return nil
	})
	dups := 0
	for _, k := range count {
		dups += k - 1
	}
	if info, err := c.DescribeGroup(ctxT(t, 5*time.Second), "workers"); err != nil || info.Redelivered == 0 {
		t.Fatalf("nothing the victim held was redelivered to the others: %v %v", info, err)
	}
	// Only what the victim printed but had not yet acked can come twice:
	// at most its window.
	if dups > 32 {
		t.Fatalf("%d duplicates; the killed consumer held at most 32 unacked", dups)
	}
}

// SIGKILL of the broker mid-consume: after the restart every message is
// delivered, and none whose ack was confirmed (Flush returned) comes again.
func TestBrokerKilledMidConsume(t *testing.T) {
	// The restart listens on the same address, so the subscription
	// reconnects to the restarted broker.
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "stream", 2)
	const total = 4000
	produceN(t, c, "stream", "e", total, 20)
	var mu sync.Mutex
	handled := map[string]int{}
	confirmed := map[string]bool{}
	var violations []string
	cc, err := client.Dial(ctxT(t, 10*time.Second), n.Addr(), client.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sub, err := cc.Subscribe(ctxT(t, 10*time.Second), client.SubscribeOptions{Group: "g", Topic: "stream", Mode: client.Shared, From: client.Earliest(), Window: 64},
		func(_ context.Context, m *client.Delivered) {
			mu.Lock()
			defer mu.Unlock()
			v := string(m.Value)
			if confirmed[v] {
				violations = append(violations, v)
			}
			handled[v]++
			time.Sleep(50 * time.Microsecond)
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	// Confirm acks in rounds: whatever was handled before a Flush returned
	// is durably acked.
	confirm := func() {
		mu.Lock()
		snap := make([]string, 0, len(handled))
		for v := range handled {
			snap = append(snap, v)
		}
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if sub.Flush(ctx) == nil {
			mu.Lock()
			for _, v := range snap {
				confirmed[v] = true
			}
			mu.Unlock()
		}
	}
	checkFor(t, 30*time.Second, "half consumed", func() error {
		confirm()
		mu.Lock()
		defer mu.Unlock()
		if len(confirmed) < total/2 {
			return fmt.Errorf("%d confirmed", len(confirmed))
		}
		return nil
	})
	n.Kill(t)
	n.Start(t) // same data dir and address: the subscription resubscribes
	checkFor(t, 30*time.Second, "everything consumed", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != total {
			return fmt.Errorf("%d of %d handled", len(handled), total)
		}
		return nil
	})
	// The first Flush reports the acks the kill lost (their messages were
	// redelivered); the next confirms everything since.
	err = sub.Flush(ctxT(t, 10*time.Second))
	if errors.Is(err, client.ErrAcksLost) {
		err = sub.Flush(ctxT(t, 10*time.Second))
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := sub.Stats(); st.Resubscribes == 0 {
		t.Fatalf("the subscription never resubscribed: %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d messages redelivered after their ack was confirmed, e.g. %v", len(violations), violations[:min(5, len(violations))])
	}
	info, err := cc.DescribeGroup(ctxT(t, 5*time.Second), "g")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range info.Partitions {
		if p.Lag != 0 {
			t.Fatalf("partition %d lag %d", p.Partition, p.Lag)
		}
	}
}

// A forced reset ends live subscriptions with a SubscriptionEnded push; the
// SDK subscribes again and continues from the reset position.
func TestForcedResetResubscribes(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "re", 1)
	produceN(t, c, "re", "r", 20, 1)
	var mu sync.Mutex
	var got []int64
	sub := subscribeT(t, dial(t, n), client.SubscribeOptions{Group: "re", Topic: "re", Mode: client.Shared, From: client.Earliest()},
		func(_ context.Context, m *client.Delivered) {
			mu.Lock()
			got = append(got, m.Offset)
			mu.Unlock()
		})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	checkFor(t, 10*time.Second, "20 delivered", func() error {
		if n := count(); n != 20 {
			return fmt.Errorf("%d", n)
		}
		return sub.Flush(ctxT(t, 5*time.Second))
	})
	if _, err := c.ResetGroup(ctxT(t, 10*time.Second), "re", client.AtOffset(15), true); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, "offsets 15-19 again after the reset", func() error {
		if n := count(); n != 25 {
			return fmt.Errorf("%d delivered", n)
		}
		return nil
	})
	// The SDK counts the resubscribe once its new session is set up,
	// which may be after that session's first deliveries.
	checkFor(t, 10*time.Second, "the resubscribe counted", func() error {
		if st := sub.Stats(); st.Resubscribes == 0 {
			return fmt.Errorf("no resubscribe: %+v", st)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got[20:]) != "[15 16 17 18 19]" {
		t.Fatalf("after the reset: %v", got[20:])
	}
}

// An idle subscription keeps its connection inside the broker's idle
// timeout (the SDK sends keep-alives at a third of it, from Hello): it
// stays one member without resubscribing.
func TestIdleSubscriptionKeptAlive(t *testing.T) {
	n := startInProc(t, t.TempDir(), "--idle-timeout=600ms")
	c := dial(t, n)
	createTopic(t, c, "quiet", 1)
	got := make(chan string, 10)
	sub := subscribeT(t, dial(t, n), client.SubscribeOptions{Group: "quiet", Topic: "quiet", Mode: client.Shared},
		func(_ context.Context, m *client.Delivered) { got <- string(m.Value) })
	waitMembers(t, c, "quiet", 1, 10*time.Second)
	deadline := time.Now().Add(2 * time.Second) // over three idle timeouts with no traffic
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	c2 := dial(t, n)
	produceN(t, c2, "quiet", "late", 1, 1)
	select {
	case v := <-got:
		if v != "late-000000" {
			t.Fatalf("got %q", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered after the idle period")
	}
	if st := sub.Stats(); st.Resubscribes != 0 {
		t.Fatalf("the idle subscription lost its connection: %+v", st)
	}
}

// waitMembers polls until group has n live members.
func waitMembers(t *testing.T, c *client.Client, group string, n int, d time.Duration) {
	t.Helper()
	checkFor(t, d, fmt.Sprintf("%d members in %s", n, group), func() error {
		info, err := c.DescribeGroup(ctxT(t, 5*time.Second), group)
		if err != nil || len(info.Members) != n {
			return fmt.Errorf("%v %v", info, err)
		}
		return nil
	})
}
