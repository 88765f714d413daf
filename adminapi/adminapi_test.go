package adminapi

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

func TestParsePosition(t *testing.T) {
	for _, ok := range []string{"earliest", "latest", "offset:0", "offset:42", "time:2026-12-02T15:04:05Z"} {
		if _, err := ParsePosition(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "sideways", "offset:", "offset:-1", "offset:x", "time:yesterday", "earliest:1x"} {
		if _, err := ParsePosition(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A lag is "growing" only when it rose at each of the last
// lagGrowingSamples refreshes.
func TestGrowing(t *testing.T) {
	var lags []LagSample
	for i := range lagGrowingSamples + 1 {
		lags = append(lags, LagSample{Lag: int64(i)})
	}
	if !growing(lags) {
		t.Fatal("a lag rising at every sample is not growing")
	}
	lags[len(lags)-3].Lag = lags[len(lags)-4].Lag
	if growing(lags) {
		t.Fatal("a lag that stood still once is growing")
	}
	if growing(lags[:lagGrowingSamples]) {
		t.Fatal("too few samples, yet growing")
	}
}

func TestBucket(t *testing.T) {
	for d, want := range map[time.Duration]string{-time.Second: "overdue", 30 * time.Second: "1m", 30 * time.Minute: "1h", 5 * time.Hour: "1d", 48 * time.Hour: "later"} {
		if got := bucket(d); got != want {
			t.Errorf("bucket(%v) = %s, want %s", d, got, want)
		}
	}
}

// Each error code the API answers with has the HTTP status a client of an
// HTTP API expects.
func TestStatusOf(t *testing.T) {
	for code, want := range map[string]int{"TOPIC_NOT_FOUND": 404, "GROUP_NOT_FOUND": 404, "NODE_NOT_FOUND": 404, "INVALID_REQUEST": 400,
		"NOT_AUTHENTICATED": 401, "NOT_AUTHORIZED": 403, "GROUP_HAS_MEMBERS": 409, "THROTTLED": 429, "NOT_READY": 503, "INTERNAL": 500} {
		if got := statusOf(code); got != want {
			t.Errorf("%s: %d, want %d", code, got, want)
		}
	}
}

// The actions' bodies are decoded from whatever a client sends: a body
// is accepted or refused with INVALID_REQUEST, never a panic.
func FuzzActionBody(f *testing.F) {
	f.Add([]byte(`{"to":"earliest","force":false,"partitions":[0,2]}`))
	f.Add([]byte(`{"from":3,"to":4}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&ResetRequest{}, &MoveRequest{}} {
			r := httptest.NewRequest("POST", "/x", strings.NewReader(string(body)))
			err := decodeBody(r, v)
			if err != nil && !strings.Contains(err.Error(), "INVALID_REQUEST") {
				t.Fatalf("%q: %v", body, err)
			}
			if rr, ok := v.(*ResetRequest); ok && err == nil {
				_, _ = ParsePosition(rr.To)
			}
		}
	})
}

type lateNode struct{ h Histogram }

func (lateNode) Membership() Membership                 { return Membership{} }
func (n lateNode) SchedulerLateness() (Histogram, bool) { return n.h, n.h.Bounds != nil }

// The scheduler view's lateness is over the window, not the process's
// life: quantiles of the difference between two samples of the histogram.
func TestLatenessOverTheWindow(t *testing.T) {
	node := &lateNode{h: Histogram{Bounds: []float64{.001, .01, .1}, Counts: []uint64{100, 100, 100}, Count: 100}}
	s := New(Config{Node: node})
	sc := &Scheduler{}
	t0 := time.Now()
	s.lateness(sc, t0, nil)
	if sc.Lateness == nil || sc.Lateness.Fired != 0 {
		t.Fatalf("first sample: %+v", sc.Lateness)
	}
	// 100 more: 98 at most 10 ms, 2 at most 100 ms.
	node.h = Histogram{Bounds: []float64{.001, .01, .1}, Counts: []uint64{100, 198, 200}, Count: 200}
	s.lateness(sc, t0.Add(10*time.Second), nil)
	if l := sc.Lateness; l.Fired != 100 || l.P50Seconds != .01 || l.P99Seconds != .1 || l.WindowSeconds != 10 {
		t.Fatalf("lateness %+v, want 100 fired, p50 10 ms, p99 100 ms over 10 s", l)
	}
	// The scheduler moves to another node: its answer carries its
	// histogram (its own counts, from its start).
	node.h = Histogram{}
	s2 := New(Config{Node: node})
	remote := &heraldpb.LatencyHistogram{Bounds: []float64{.001, .01, .1}, CumulativeCounts: []uint64{5, 5, 5}, Count: 5}
	s2.lateness(sc, t0, remote)
	remote = &heraldpb.LatencyHistogram{Bounds: []float64{.001, .01, .1}, CumulativeCounts: []uint64{55, 55, 55}, Count: 55}
	s2.lateness(sc, t0.Add(5*time.Second), remote)
	if l := sc.Lateness; l == nil || l.Fired != 50 || l.P99Seconds != .001 || sc.LatenessNote != "" {
		t.Fatalf("from the scheduler's answer: %+v %q", l, sc.LatenessNote)
	}
	sc = &Scheduler{}
	s2.lateness(sc, t0.Add(6*time.Second), nil)
	if sc.Lateness != nil || !strings.Contains(sc.LatenessNote, "did not report") {
		t.Fatalf("with no histogram anywhere: %+v %q", sc.Lateness, sc.LatenessNote)
	}
}
