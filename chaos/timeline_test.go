package chaos

import (
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

func TestTimelineOf(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	ops := []history.Op{
		{Time: ms(0), Process: "producer-0", Type: history.Invoke, F: history.Produce, Seq: 0},
		{Time: ms(3), Process: "producer-1", Type: history.Invoke, F: history.Produce, Seq: 0},
		{Time: ms(5), Process: "producer-0", Type: history.OK, F: history.Produce, Seq: 0},
		{Time: ms(10), Process: "nemesis", Type: history.Invoke, F: history.Nemesis, Fault: "kill", Node: 2},
		{Time: ms(1010), Process: "producer-1", Type: history.Info, F: history.Produce, Seq: 0},
		{Time: ms(2000), Process: "nemesis", Type: history.OK, F: history.Nemesis, Fault: "kill", Node: 2},
		{Time: ms(2500), Process: "nemesis", Type: history.Invoke, F: history.Nemesis, Fault: "pause", Node: 1},
		{Time: ms(3000), Process: "reader-0", Type: history.OK, F: history.Consume},
	}
	samples, windows := timelineOf(ops)
	if len(samples) != 2 || !samples[0].OK || samples[0].Latency != 5*time.Millisecond ||
		samples[1].OK || samples[1].Latency != 1007*time.Millisecond || samples[1].At != 1010*time.Millisecond {
		t.Fatalf("samples = %+v", samples)
	}
	if len(windows) != 2 || windows[0].Name != "kill n2" || windows[0].From != 10*time.Millisecond || windows[0].To != 2*time.Second ||
		windows[1].Name != "pause n1" || windows[1].To != 3*time.Second {
		t.Fatalf("windows = %+v (a fault never ended runs to the last op)", windows)
	}
}

func TestReplicaPartition(t *testing.T) {
	for _, c := range []struct {
		base, topic string
		part        int
		ok          bool
	}{
		{"chaos-2-3", "chaos", 2, true},
		{"chaos-10-1", "chaos", 10, true},
		{"chaos-rpc-0-1", "chaos", 0, false},
		{"other-0-1", "chaos", 0, false},
		{"chaos-x-1", "chaos", 0, false},
		{"chaos-4", "chaos", 4, true},
		{"chaos-rpc", "chaos", 0, false},
	} {
		p, ok := replicaPartition(c.base, c.topic)
		if ok != c.ok || ok && p != c.part {
			t.Errorf("replicaPartition(%q, %q) = %d, %v; want %d, %v", c.base, c.topic, p, ok, c.part, c.ok)
		}
	}
}
