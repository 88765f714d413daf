package e2e

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Vhosts are isolated namespaces: both vhosts have a topic "orders" and a
// group "g", each sees, reads and lists only its own; names cannot reach
// across; a user lets into one vhost is refused by the other; the vhosts
// survive a restart, and one with topics is not deleted.
func TestVhostIsolation(t *testing.T) {
	p, adminPW := startAuthBroker(t)
	ctx := ctxT(t, 90*time.Second)
	as := []string{"--addr", p.Addr(), "--user", "admin", "--password-file", adminPW}
	for _, v := range []string{"A", "B"} {
		out, errOut, code := herald(t, "", append([]string{"vhost", "add", v}, as...)...)
		if code != 0 || out != "created vhost "+v+"\n" {
			t.Fatalf("vhost add %s: %d %q %q", v, code, out, errOut)
		}
	}
	inA := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("A"))
	inB := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("B"))
	inDefault := dial(t, p, client.WithSCRAM("admin", "admin-secret"))
	for c, v := range map[*client.Client]string{inA: "A", inB: "B"} {
		if _, err := c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatalf("orders in %s: %v", v, err)
		}
		if _, err := c.NewProducer().Send(ctx, &client.Message{Topic: "orders", Value: []byte("from " + v)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := inA.CreateTopic(ctx, "only-a", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	for c, v := range map[*client.Client]string{inA: "A", inB: "B"} {
		r, err := c.Fetch(ctx, "orders", 0, 0, 1<<20, 0)
		if err != nil || len(r.Messages) != 1 || string(r.Messages[0].Value) != "from "+v {
			t.Fatalf("orders in %s: %v %v", v, r, err)
		}
	}
	names := func(c *client.Client) string {
		ts, err := c.ListTopics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, x := range ts {
			n = append(n, x.Name)
		}
		sort.Strings(n)
		return strings.Join(n, ",")
	}
	if a, b, d := names(inA), names(inB), names(inDefault); a != "only-a,orders" || b != "orders" || d != "" {
		t.Fatalf("listings: A %q, B %q, default %q", a, b, d)
	}
	if _, err := inB.DescribeTopic(ctx, "only-a"); !client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) || strings.Contains(err.Error(), "A~") {
		t.Fatalf("B describes A's topic: %v", err)
	}
	if _, err := inB.NewProducer().Send(ctx, &client.Message{Topic: "only-a", Value: []byte("x")}); !client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		t.Fatalf("B writes A's topic: %v", err)
	}
	for _, c := range []*client.Client{inB, inDefault} {
		if _, err := c.Fetch(ctx, "A~orders", 0, 0, 1<<20, 0); !client.IsCode(err, heraldpb.ErrorCode_INVALID_REQUEST) {
			t.Fatalf("a name reaching into A: %v", err)
		}
	}
	// Groups of the same name in both.
	for c, v := range map[*client.Client]string{inA: "A", inB: "B"} {
		got := make(chan string, 1)
		sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "orders", Mode: client.Shared, From: client.Earliest()}, func(_ context.Context, m *client.Delivered) {
			m.Ack()
			select {
			case got <- string(m.Value):
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if m := <-got; m != "from "+v {
			t.Fatalf("group g in %s got %q", v, m)
		}
		gs, err := c.ListGroups(ctx)
		if err != nil || len(gs) != 1 || gs[0].Group != "g" || gs[0].Topic != "orders" {
			t.Fatalf("groups in %s: %v %v", v, gs, err)
		}
		sub.Close(ctx)
	}
	// Delayed messages: another vhost can neither list nor cancel A's.
	res, err := inA.NewProducer().Send(ctx, &client.Message{Topic: "orders", Value: []byte("later"), Delay: time.Hour})
	if err != nil || res.ScheduleID == "" {
		t.Fatalf("delayed produce in A: %v %v", res, err)
	}
	for _, c := range []*client.Client{inB, inDefault} {
		if err := c.CancelScheduled(ctx, res.ScheduleID); !client.IsCode(err, heraldpb.ErrorCode_SCHEDULE_NOT_FOUND) {
			t.Fatalf("cancel of A's delayed message from another vhost: %v", err)
		}
		if list, _, err := c.ListScheduled(ctx, "", 100); err != nil || len(list) != 0 {
			t.Fatalf("another vhost lists A's delayed messages: %v %v", list, err)
		}
	}
	if list, _, err := inA.ListScheduled(ctx, "", 100); err != nil || len(list) != 1 || list[0].Topic != "orders" {
		t.Fatalf("A's delayed messages: %v %v", list, err)
	}
	if err := inA.CancelScheduled(ctx, res.ScheduleID); err != nil {
		t.Fatalf("A cancels its own: %v", err)
	}
	// alice may work in A only.
	if err := inDefault.AddUser(ctx, "alice", "alice-secret", 0); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := herald(t, "", append([]string{"acl", "add", "--principal", "user:alice", "--operation", "all", "--access-vhost", "A"}, as...)...)
	if code != 0 {
		t.Fatalf("acl add vhost: %s", errOut)
	}
	_, errOut, code = herald(t, "", append([]string{"acl", "add", "--vhost", "A", "--principal", "user:alice", "--operation", "all", "--topic", "*"}, as...)...)
	if code != 0 {
		t.Fatalf("acl add in A: %s", errOut)
	}
	if _, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("alice", "alice-secret"), client.WithVhost("B")); !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), `may not use vhost "B"`) {
		t.Fatalf("alice into B: %v", err)
	}
	alice := dial(t, p, client.WithSCRAM("alice", "alice-secret"), client.WithVhost("A"))
	if _, err := alice.NewProducer().Send(ctx, &client.Message{Topic: "orders", Value: []byte("alice")}); err != nil {
		t.Fatalf("alice in A: %v", err)
	}
	aliceDefault := dial(t, p, client.WithSCRAM("alice", "alice-secret"))
	if _, err := aliceDefault.NewProducer().Send(ctx, &client.Message{Topic: "orders", Value: []byte("x")}); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatalf("A's * rule let alice into the default vhost: %v", err)
	}
	out, _, _ := herald(t, "", append([]string{"acl", "list", "--vhost", "A", "--principal", "user:alice"}, as...)...)
	if !regexpLine(out, `^user:alice\s+allow\s+all\s+topic\s+\*\s+literal$`) {
		t.Fatalf("acl list in A: %q", out)
	}
	// A user's quotas: the topics it creates, and its connections.
	if _, errOut, code := herald(t, "", append([]string{"user", "quota", "alice", "--max-connections", "2", "--max-topics", "1"}, as...)...); code != 0 {
		t.Fatalf("user quota: %s", errOut)
	}
	if _, err := alice.CreateTopic(ctx, "mine", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if ti, err := alice.DescribeTopic(ctx, "mine"); err != nil || ti.GetConfig().GetOwner() != "alice" {
		t.Fatalf("mine's owner: %v %v", ti, err)
	}
	if _, err := alice.CreateTopic(ctx, "mine2", &heraldpb.TopicConfig{Partitions: 1}); !client.IsCode(err, heraldpb.ErrorCode_QUOTA_EXCEEDED) || !strings.Contains(err.Error(), `user "alice" has 1 topics, its quota is 1`) {
		t.Fatalf("alice's second topic: %v", err)
	}
	checkFor(t, 10*time.Second, "alice's third connection refused", func() error {
		c, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("alice", "alice-secret"), client.WithVhost("A"))
		if err == nil {
			c.Close()
			return errors.New("connected")
		}
		if !client.IsCode(err, heraldpb.ErrorCode_QUOTA_EXCEEDED) {
			t.Fatalf("alice's third connection: %v", err)
		}
		return nil
	})
	// Unknown vhost; a vhost with topics stays; vhosts survive a restart.
	if _, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("admin", "admin-secret"), client.WithVhost("C")); !client.IsCode(err, heraldpb.ErrorCode_VHOST_NOT_FOUND) {
		t.Fatalf("unknown vhost: %v", err)
	}
	if _, errOut, code := herald(t, "", append([]string{"vhost", "delete", "A"}, as...)...); code == 0 || !strings.Contains(errOut, "has 3 topics") {
		t.Fatalf("delete A with topics: %d %q", code, errOut)
	}
	p.Stop(t)
	p.Start(t)
	a2 := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("A"))
	if got := names(a2); got != "mine,only-a,orders" {
		t.Fatalf("A after a restart: %q", got)
	}
	out, errOut, code = herald(t, "", append([]string{"vhost", "list"}, as...)...)
	if code != 0 || !regexpLine(out, `^A\s+3\s+3\s+`) || !regexpLine(out, `^B\s+1\s+1\s+`) || !regexpLine(out, `^/\s+0\s+0\s+`) {
		t.Fatalf("vhost list: %d %q %q", code, out, errOut)
	}
}

// A produce quota throttles one tenant (THROTTLED with a retry-after,
// which the SDK waits out) to about its rate, while another tenant on
// the same broker produces unthrottled; count quotas refuse with
// QUOTA_EXCEEDED.
func TestVhostQuotaThrottlesOneTenant(t *testing.T) {
	p := startProc(t, t.TempDir())
	const rate = 256 << 10
	for _, args := range [][]string{
		{"vhost", "add", "A", "--produce-rate", "262144", "--max-topics", "1", "--max-connections", "3"},
		{"vhost", "add", "B"},
	} {
		if _, errOut, code := herald(t, "", append(args, "--addr", p.Addr())...); code != 0 {
			t.Fatalf("%v: %s", args, errOut)
		}
	}
	ctx := ctxT(t, 90*time.Second)
	a := dial(t, p, client.WithVhost("A"))
	b := dial(t, p, client.WithVhost("B"))
	for _, c := range []*client.Client{a, b} {
		if _, err := c.CreateTopic(ctx, "t", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.CreateTopic(ctx, "t2", &heraldpb.TopicConfig{Partitions: 1}); !client.IsCode(err, heraldpb.ErrorCode_QUOTA_EXCEEDED) || !strings.Contains(err.Error(), "quota is 1") {
		t.Fatalf("A's second topic: %v", err)
	}
	const window = 4 * time.Second
	var aBytes atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(window)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr := a.NewProducer()
			val := make([]byte, 16<<10)
			for time.Now().Before(stop) {
				if _, err := pr.Send(ctx, &client.Message{Topic: "t", Value: val}); err == nil {
					aBytes.Add(int64(len(val)))
				}
			}
		}()
	}
	var lat []time.Duration
	pb := b.NewProducer()
	for time.Now().Before(stop) {
		t0 := time.Now()
		if _, err := pb.Send(ctx, &client.Message{Topic: "t", Value: make([]byte, 1024)}); err != nil {
			t.Fatalf("B's produce: %v", err)
		}
		lat = append(lat, time.Since(t0))
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p99 := lat[len(lat)*99/100]
	got := float64(aBytes.Load()) / elapsed.Seconds()
	t.Logf("A: %.0f B/s against a quota of %d B/s; B: %d produces, p99 %v", got, rate, len(lat), p99)
	// One second's burst and one request in flight per worker may pass
	// on top of the rate.
	if limit := float64(rate) + float64(rate+2*(16<<10))/elapsed.Seconds(); got > limit*1.1 {
		t.Fatalf("A produced %.0f B/s, over its quota (%d B/s, at most %.0f with the burst)", got, rate, limit)
	}
	if v := metricLabelled(t, p, `herald_quota_refused_total{account="vhost:A",quota="produce_rate"}`); v < 1 {
		t.Fatalf("A's throttles counted: %v", v)
	}
	if v := metricLabelled(t, p, `herald_quota_refused_total{account="vhost:B",quota="produce_rate"}`); v > 0 {
		t.Fatalf("B was throttled %v times", v)
	}
	if p99 > 2*time.Second {
		t.Fatalf("B's produce p99 %v while A was throttled", p99)
	}
	// The connection quota: a and two more, then refused.
	extra := []*client.Client{dial(t, p, client.WithVhost("A")), dial(t, p, client.WithVhost("A"))}
	_ = extra
	if _, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithVhost("A")); !client.IsCode(err, heraldpb.ErrorCode_QUOTA_EXCEEDED) {
		t.Fatalf("A's fourth connection: %v", err)
	}
}

// A consume quota holds a push subscription to its rate (the broker
// pushes no faster than the bucket refills) and answers fetches past it
// with THROTTLED and a retry-after.
func TestVhostConsumeQuota(t *testing.T) {
	p := startProc(t, t.TempDir())
	const rate = 128 << 10
	if _, errOut, code := herald(t, "", "vhost", "add", "C", "--consume-rate", "131072", "--addr", p.Addr()); code != 0 {
		t.Fatal(errOut)
	}
	ctx := ctxT(t, 90*time.Second)
	c := dial(t, p, client.WithVhost("C"))
	if _, err := c.CreateTopic(ctx, "t", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	const n, size = 512, 1 << 10
	pr := c.NewProducer()
	for i := 0; i < n; i++ {
		pr.SendAsync(ctx, &client.Message{Topic: "t", Value: make([]byte, size)}, nil)
	}
	if err := pr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Push: 512 KiB at 128 KiB/s after a 128 KiB burst, less what a
	// dispatch may overshoot by (64 messages at most), takes 2.5 s or more.
	var got atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "t", Mode: client.Shared, From: client.Earliest()}, func(_ context.Context, m *client.Delivered) {
		m.Ack()
		if got.Add(1) == n {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%d of %d pushed", got.Load(), n)
	}
	pushed := time.Since(start)
	t.Logf("pushed %d KiB in %v against a quota of %d KiB/s", n*size>>10, pushed, rate>>10)
	if min := time.Duration(float64(n*size-rate-64*size) / rate * float64(time.Second)); pushed < min {
		t.Fatalf("pushed %d bytes in %v: faster than the quota allows (at least %v)", n*size, pushed, min)
	}
	// Fetch: reading it all again, 64 KiB a fetch, runs into THROTTLED.
	// (A fetch is admitted while the bucket is not empty and charged for
	// its answer after: one fetch of all 512 KiB, right when the pushes
	// had used the bucket up to exactly zero, was answered whole.)
	var throttled error
	for off := int64(0); off < n && throttled == nil; {
		r, err := c.Fetch(ctx, "t", 0, off, 64<<10, 0)
		switch {
		case client.IsCode(err, heraldpb.ErrorCode_THROTTLED):
			throttled = err
		case err != nil:
			t.Fatal(err)
		default:
			off = r.NextOffset
		}
	}
	if throttled == nil || !strings.Contains(throttled.Error(), "consume_rate quota of 131072 bytes/s") {
		t.Fatalf("fetching 512 KiB twice over a 128 KiB/s quota: %v", throttled)
	}
}
