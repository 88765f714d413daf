package partition

import (
	"context"
	"fmt"
	"log/slog"
)

// raftLogger adapts raft's logger to slog. Raft's Info is chatty (every
// election), so it goes to Debug; warnings and errors keep their level.
type raftLogger struct{ l *slog.Logger }

// debug reports whether Debug is on: raft formats its messages eagerly,
// which cost a tenth of a node's CPU in election storms of 1,000 groups.
func (r raftLogger) debug() bool { return r.l.Enabled(context.Background(), slog.LevelDebug) }

func (r raftLogger) Debug(v ...interface{}) {
	if r.debug() {
		r.l.Debug(fmt.Sprint(v...))
	}
}
func (r raftLogger) Debugf(format string, v ...interface{}) {
	if r.debug() {
		r.l.Debug(fmt.Sprintf(format, v...))
	}
}
func (r raftLogger) Info(v ...interface{}) { r.Debug(v...) }
func (r raftLogger) Infof(format string, v ...interface{}) {
	r.Debugf(format, v...)
}
func (r raftLogger) Warning(v ...interface{}) { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...interface{}) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...interface{})                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...interface{}) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...interface{})                 { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...interface{}) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
func (r raftLogger) Panic(v ...interface{}) { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...interface{}) {
	panic(fmt.Sprintf(format, v...))
}
