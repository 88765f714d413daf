package chaos

import (
	"fmt"
	"time"

	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/report"
)

// timelineOf turns a history into the report's samples (each produce's
// completion and latency) and windows (each fault from its start to its
// end; a fault that never ended runs to the last op).
func timelineOf(ops []history.Op) ([]report.Sample, []report.Window) {
	type key struct {
		p   string
		seq int64
	}
	invoked := map[key]int64{}
	faults := map[string]int{} // fault@node -> index in windows of the open one
	var samples []report.Sample
	var windows []report.Window
	var last int64
	for _, op := range ops {
		last = max(last, op.Time)
		switch op.F {
		case history.Produce:
			k := key{op.Process, op.Seq}
			if op.Type == history.Invoke {
				invoked[k] = op.Time
				continue
			}
			at, ok := invoked[k]
			if !ok {
				continue
			}
			delete(invoked, k)
			samples = append(samples, report.Sample{At: time.Duration(op.Time), Latency: time.Duration(op.Time - at), OK: op.Type == history.OK})
		case history.Nemesis:
			name := op.Fault
			if op.Node != 0 {
				name = fmt.Sprintf("%s n%d", op.Fault, op.Node)
			}
			k := name
			if op.Type == history.Invoke {
				faults[k] = len(windows)
				windows = append(windows, report.Window{Name: name, From: time.Duration(op.Time), To: -1})
				continue
			}
			if i, ok := faults[k]; ok {
				windows[i].To = time.Duration(op.Time)
				delete(faults, k)
			}
		}
	}
	for i := range windows {
		if windows[i].To < 0 {
			windows[i].To = time.Duration(last)
		}
	}
	return samples, windows
}
