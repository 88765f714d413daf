package timewheel

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestWheelModel drives the wheel and a sorted-list model with random adds
// (from the past to 100 days ahead), cancels and advances (from 1 ms to
// weeks): every Advance must fire exactly the model's due timers, in order.
func TestWheelModel(t *testing.T) {
	for seed := uint64(1); seed <= uint64(*modelSeeds); seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		start := int64(1_700_000_000_000) + r.Int64N(1<<20)
		w := NewWheel(start, nil)
		var model []Entry
		now, ref := start, uint64(0)
		scales := []int64{4, 300, 70_000, 5_000_000, 9_000_000_000}
		var out []Entry
		for step := 0; step < 4000; step++ {
			switch op := r.IntN(10); {
			case op < 6:
				ref++
				d := r.Int64N(scales[r.IntN(len(scales))]) - 2
				e := Entry{At: now + d, Ref: ref}
				w.Add(e)
				model = append(model, e)
			case op == 6 && len(model) > 0:
				i := r.IntN(len(model))
				if !w.Cancel(model[i]) {
					t.Fatalf("seed %d step %d: cancel of pending %v failed (%v)", seed, step, model[i], w)
				}
				model = slices.Delete(model, i, i+1)
				if w.Cancel(Entry{At: now + 5, Ref: 1 << 60}) {
					t.Fatal("cancel of an unknown timer succeeded")
				}
			default:
				now += 1 + r.Int64N(scales[r.IntN(len(scales))])
				out = w.Advance(now, out[:0])
				slices.SortFunc(model, Entry.compare)
				n := 0
				for n < len(model) && model[n].At <= now {
					n++
				}
				if !slices.Equal(out, model[:n]) {
					t.Fatalf("seed %d step %d: advance to %d fired %d timers, want %d\n got %v\nwant %v", seed, step, now, len(out), n, head(out), head(model[:n]))
				}
				model = slices.Delete(model, 0, n)
			}
			if w.Len() != len(model) {
				t.Fatalf("seed %d step %d: Len %d, model %d (%v)", seed, step, w.Len(), len(model), w)
			}
		}
	}
}

func head(es []Entry) []Entry { return es[:min(len(es), 8)] }

// A timer is never early and, advanced every millisecond, never late.
func TestWheelExactToTheMillisecond(t *testing.T) {
	start := int64(1 << 40)
	w := NewWheel(start, nil)
	r := rand.New(rand.NewPCG(3, 4))
	want := map[uint64]int64{}
	for i := uint64(1); i <= 5000; i++ {
		at := start + 1 + r.Int64N(200_000) // up to 200 s: every level and the far store
		w.Add(Entry{At: at, Ref: i})
		want[i] = at
	}
	var out []Entry
	for now := start + 1; now <= start+200_001; now++ {
		out = w.Advance(now, out[:0])
		for _, e := range out {
			if want[e.Ref] != now {
				t.Fatalf("timer %d for %d fired at %d", e.Ref, want[e.Ref], now)
			}
			delete(want, e.Ref)
		}
	}
	if len(want) != 0 || w.Len() != 0 {
		t.Fatalf("%d timers never fired (%v)", len(want), w)
	}
}

// Pending timers cost no heap object each: 1M timers spread over 90 days
// take about one object per far bucket (65.536 s, so ~119k for 90 days,
// however many timers) and 16-32 bytes per timer.
func TestWheelMemory(t *testing.T) {
	const n = 1_000_000
	start := int64(1 << 40)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := NewWheel(start, nil)
	r := rand.New(rand.NewPCG(5, 6))
	for i := uint64(0); i < n; i++ {
		w.Add(Entry{At: start + 1 + r.Int64N(90*24*3600*1000), Ref: i})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	objects := after.HeapObjects - before.HeapObjects
	bytes := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d timers: %d heap objects, %.1f bytes each", n, objects, float64(bytes)/n)
	buckets := uint64(90*24*3600*1000/FarBucketMs + 1)
	if objects > buckets+buckets/5 || bytes > 48*n {
		t.Fatalf("%d timers took %d heap objects and %d bytes", n, objects, bytes)
	}
	runtime.KeepAlive(w)
}

var modelSeeds = flag.Int("model-seeds", 20, "seeds of TestWheelModel")

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/wheel/*.txt")

// TestWheelScenarios runs testdata/wheel/*.txt: blocks of a command, a
// "----" line and its expected output; -rewrite regenerates the output.
// Times are milliseconds relative to the wheel's start. Commands:
//
//	add AT REF...        add timers REF... at AT
//	cancel AT REF        cancel one
//	advance TO           move the clock; prints the fired timers "AT:REF"
//	state                the wheel's counters
func TestWheelScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/wheel/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			runWheelFile(t, f, func(start int64) scenarioWheel { return plainWheel{NewWheel(start, nil)} }, *rewrite)
		})
	}
}

// scenarioWheel is what a scenario drives: a Wheel, or a Wheel with a
// far store driven as the scheduler drives it.
type scenarioWheel interface {
	add(e Entry)
	cancel(e Entry) bool
	advance(now int64, out []Entry) []Entry
	now() int64
	len() int
	near() int
}

type plainWheel struct{ w *Wheel }

func (p plainWheel) add(e Entry)                            { p.w.Add(e) }
func (p plainWheel) cancel(e Entry) bool                    { return p.w.Cancel(e) }
func (p plainWheel) advance(now int64, out []Entry) []Entry { return p.w.Advance(now, out) }
func (p plainWheel) now() int64                             { return p.w.Now() }
func (p plainWheel) len() int                               { return p.w.Len() }
func (p plainWheel) near() int                              { return p.w.Near() }

// runWheelFile runs one scenario file on the wheel newWheel makes;
// rewrite regenerates its expected output instead of checking it.
func runWheelFile(t *testing.T, path string, newWheel func(start int64) scenarioWheel, rewrite bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const start = int64(1) << 40 // a multiple of every window: relative times read as windows
	w := newWheel(start)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out strings.Builder
	num := func(s string) int64 {
		v, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
		if err != nil {
			t.Fatalf("%s: bad number %q", path, s)
		}
		return v
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			out.WriteString(l + "\n")
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ---- line", path, i+1)
		}
		cmd, at := l, i+1
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		i--
		f := strings.Fields(cmd)
		var got []string
		switch f[0] {
		case "add":
			for _, r := range f[2:] {
				w.add(Entry{At: start + num(f[1]), Ref: uint64(num(r))})
			}
		case "cancel":
			got = append(got, fmt.Sprint(w.cancel(Entry{At: start + num(f[1]), Ref: uint64(num(f[2]))})))
		case "advance":
			for _, e := range w.advance(start+num(f[1]), nil) {
				got = append(got, fmt.Sprintf("%d:%d", e.At-start, e.Ref))
			}
		case "state":
			got = append(got, fmt.Sprintf("now=%d pending=%d near=%d", w.now()-start, w.len(), w.near()))
		default:
			t.Fatalf("%s:%d: unknown command %q", path, at, f[0])
		}
		res := strings.Join(got, "\n")
		if res == "" {
			res = "ok"
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", cmd, res)
		if !rewrite && res != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, at, cmd, res, strings.Join(want, "\n"))
		}
	}
	if rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkWheelAddAdvance(b *testing.B) {
	start := int64(1 << 40)
	w := NewWheel(start, nil)
	r := rand.New(rand.NewPCG(1, 1))
	var out []Entry
	now := start
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		w.Add(Entry{At: now + 1 + r.Int64N(60_000), Ref: uint64(i)})
		if i%64 == 0 {
			now += 1
			out = w.Advance(now, out[:0])
		}
	}
}

// TestWheelNextAt: advancing to NextAt repeatedly fires every timer at its
// time, never early, and NextAt never skips past a pending timer.
func TestWheelNextAt(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	const start = int64(1_000_000_000_000)
	w := NewWheel(start, nil)
	var want []Entry
	for i := range 5000 {
		d := r.Int64N(3 * FarBucketMs)
		if i%10 == 0 {
			d = r.Int64N(300)
		}
		e := Entry{At: start + d, Ref: uint64(i)}
		want = append(want, e)
		w.Add(e)
	}
	slices.SortFunc(want, Entry.compare)
	var got []Entry
	for steps := 0; ; steps++ {
		at, ok := w.NextAt()
		if !ok {
			break
		}
		if at < w.Now() {
			t.Fatalf("NextAt %d before Now %d", at, w.Now())
		}
		if len(want) > len(got) && at > want[len(got)].At {
			t.Fatalf("NextAt %d skips pending timer %v", at, want[len(got)])
		}
		before := len(got)
		got = w.Advance(at, got)
		for _, e := range got[before:] {
			if e.At > at {
				t.Fatalf("fired %v early at %d", e, at)
			}
		}
		if steps > 100000 {
			t.Fatal("NextAt does not converge")
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %d of %d, or out of order", len(got), len(want))
	}
}
