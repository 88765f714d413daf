// The Recorder under concurrency and write errors, Read's errors, and FuzzRead.

package history

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tick is a clock that moves 1µs each time it is read.
func tick() func() time.Duration {
	var n atomic.Int64
	return func() time.Duration { return time.Duration(n.Add(1)) * time.Microsecond }
}

func TestRecorderConcurrent(t *testing.T) {
	var buf bytes.Buffer
	r := NewRecorder(&buf, tick())
	const procs, each = 8, 200
	var wg sync.WaitGroup
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range each {
				op := Op{Process: fmt.Sprintf("producer-%d", p), Type: Invoke, F: Produce, Topic: "orders",
					Value: fmt.Sprintf("p%d-%d", p, s), Seq: int64(s), Idempotent: true}
				if _, err := r.Record(op); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	ops, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != procs*each {
		t.Fatalf("read %d ops, want %d", len(ops), procs*each)
	}
	next := map[string]int64{}
	for i, op := range ops {
		if op.Index != int64(i) {
			t.Fatalf("line %d has index %d", i+1, op.Index)
		}
		if i > 0 && op.Time <= ops[i-1].Time {
			t.Fatalf("op %d at %d, op %d at %d: time went back", i-1, ops[i-1].Time, i, op.Time)
		}
		if op.Seq != next[op.Process] {
			t.Fatalf("op %d: %s seq %d, want %d (one process's ops out of order)", i, op.Process, op.Seq, next[op.Process])
		}
		next[op.Process]++
	}
}

func TestRecorderRoundTripEveryField(t *testing.T) {
	var buf bytes.Buffer
	r := NewRecorder(&buf, tick())
	in := []Op{
		{Process: "producer-3", Type: OK, F: Produce, Topic: "orders", Partition: 2, Key: "k1", Value: "p3-17",
			Offset: 41, ProducerID: 1<<63 + 5, Seq: 17, Idempotent: true, Due: 5e9},
		{Process: "consumer-1", Type: OK, F: Consume, Topic: "orders.dlq", Group: "g", Mode: ModeKeyShared,
			Consumer: "c1", MaxDeliveries: 3, DLQ: true, Attempt: 4, Value: "p3-17"},
		{Process: "requester-0", Type: Info, F: Request, RequestID: "r-9", ReplyTo: "inbox-0", Error: "timeout"},
		{Process: "nemesis", Type: Invoke, F: Nemesis, Fault: "kill", Node: 2},
		{Process: "checker", Type: OK, F: FinalRead, Topic: "orders", Partition: 2, Node: 1,
			Records: []Record{{Offset: 0, Value: "p3-0"}, {Offset: 1, Key: "k1", Value: "p3-1"}}},
	}
	var want []Op
	for _, op := range in {
		got, err := r.Record(op)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, got)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, want)
	}
}

func TestRecorderRejectsBadOp(t *testing.T) {
	var buf bytes.Buffer
	r := NewRecorder(&buf, tick())
	for _, op := range []Op{
		{Process: "p", Type: "done", F: Produce},
		{Process: "p", Type: OK, F: "send"},
		{Type: OK, F: Produce},
	} {
		if _, err := r.Record(op); !errors.Is(err, ErrBadOp) {
			t.Errorf("Record(%+v) = %v, want ErrBadOp", op, err)
		}
	}
	if buf.Len() != 0 {
		t.Fatalf("bad ops written: %q", buf.String())
	}
	op, err := r.Record(Op{Process: "p", Type: OK, F: Ack})
	if err != nil || op.Index != 0 {
		t.Fatalf("first good op: index %d, %v; want 0 (bad ops take no index)", op.Index, err)
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(b []byte) (int, error) {
	if w.n == 0 {
		return 0, io.ErrShortWrite
	}
	w.n--
	return len(b), nil
}

func TestRecorderWriteErrorSticks(t *testing.T) {
	r := NewRecorder(&failWriter{n: 1}, tick())
	op := Op{Process: "p", Type: Invoke, F: Produce}
	if _, err := r.Record(op); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Record(op); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("second Record = %v, want the write error", err)
	}
	if _, err := r.Record(op); !errors.Is(err, io.ErrShortWrite) || !errors.Is(r.Err(), io.ErrShortWrite) {
		t.Fatalf("after a write error: Record %v, Err %v; want it to stick", err, r.Err())
	}
}

func TestReadMalformed(t *testing.T) {
	const good = `{"i":0,"t":5,"p":"producer-0","type":"invoke","f":"produce","value":"p0-0"}`
	for _, tc := range []struct {
		name, in string
		line     int
		badOp    bool // the cause matches ErrBadOp
	}{
		{"not json", good + "\nhello\n", 2, false},
		{"array", "[1,2]\n", 1, false},
		{"truncated", good + "\n" + good[:30], 2, false},
		{"two objects", good + " {}\n", 1, false},
		{"trailing brace", good + "}\n", 1, false},
		{"unknown field", `{"i":0,"t":0,"p":"x","type":"ok","f":"ack","colour":"red"}`, 1, false},
		{"wrong field type", `{"i":"zero","t":0,"p":"x","type":"ok","f":"ack"}`, 1, false},
		{"unknown type", `{"i":0,"t":0,"p":"x","type":"maybe","f":"ack"}`, 1, true},
		{"unknown f", good + "\n\n" + `{"i":1,"t":0,"p":"x","type":"ok","f":"send"}`, 3, true},
		{"no process", `{"i":0,"t":0,"type":"ok","f":"ack"}`, 1, true},
		{"negative time", `{"i":0,"t":-1,"p":"x","type":"ok","f":"ack"}`, 1, true},
		{"index repeated", good + "\n" + good + "\n", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := Read(strings.NewReader(tc.in))
			var le *LineError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &le) {
				t.Fatalf("Read = %d ops, %v; want a *LineError", len(ops), err)
			}
			if le.Line != tc.line {
				t.Fatalf("error %q names line %d, want %d", err, le.Line, tc.line)
			}
			if errors.Is(err, ErrBadOp) != tc.badOp {
				t.Fatalf("error %q: errors.Is(ErrBadOp) = %v, want %v", err, !tc.badOp, tc.badOp)
			}
		})
	}
}

func TestReadLenient(t *testing.T) {
	in := "\n  {\"i\":3,\"t\":5,\"p\":\"nemesis\",\"type\":\"invoke\",\"f\":\"nemesis\",\"fault\":\"kill\",\"node\":2}  \r\n\n" +
		`{"i":9,"t":6,"p":"nemesis","type":"ok","f":"nemesis","fault":"kill","node":2,"records":[]}`
	ops, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[1].Index != 9 || ops[1].Records != nil || ops[0].Fault != "kill" {
		t.Fatalf("read %+v", ops)
	}
	if ops, err := Read(strings.NewReader("")); err != nil || len(ops) != 0 {
		t.Fatalf("empty history: %v, %v", ops, err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestReadReaderError(t *testing.T) {
	_, err := Read(errReader{})
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrMalformed) {
		t.Fatalf("Read = %v, want the reader's error, not ErrMalformed", err)
	}
}

// FuzzRead guarantees that Read never panics; that its content errors are
// *LineError values matching ErrMalformed with a line inside the input;
// and that a history it accepts has increasing indexes, valid ops, and
// survives Write and another Read unchanged.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"i":0,"t":1,"p":"producer-0","type":"ok","f":"produce","topic":"t","value":"p0-0","seq":1}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		ops, err := Read(bytes.NewReader(in))
		if err != nil {
			var le *LineError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &le) {
				t.Fatalf("Read(%q) = %v, want a *LineError", in, err)
			}
			if lines := bytes.Count(in, []byte("\n")) + 1; le.Line < 1 || le.Line > lines {
				t.Fatalf("Read(%q): line %d outside 1..%d", in, le.Line, lines)
			}
			return
		}
		for i, op := range ops {
			if err := op.Validate(); err != nil {
				t.Fatalf("Read(%q) accepted op %d: %v", in, i, err)
			}
			if i > 0 && op.Index <= ops[i-1].Index {
				t.Fatalf("Read(%q) accepted index %d after %d", in, op.Index, ops[i-1].Index)
			}
		}
		var buf bytes.Buffer
		if err := Write(&buf, ops); err != nil {
			t.Fatal(err)
		}
		again, err := Read(&buf)
		if err != nil || !reflect.DeepEqual(again, ops) {
			t.Fatalf("Read(%q) = %+v; written and read again: %+v, %v", in, ops, again, err)
		}
	})
}
