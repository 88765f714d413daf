package broker

import (
	"encoding/json"
	"fmt"
	"github.com/heraldmq/herald/auth"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/heraldmq/herald/netio"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The audit log: one JSON object per line (time, principal, remote,
// vhost, action, resource, outcome, message) for every administrative
// request, refusal for want of a login or a permission, failed login, and
// admin-port request past its open endpoints. It rotates at
// auditMaxBytes, keeping one previous file (PATH.1).

const auditMaxBytes = 64 << 20

var mAudit = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "herald_audit_events_total",
	Help: "Audit log entries written, by outcome (ok, or the error code); dropped counts those the file refused.",
}, []string{"outcome"})

type auditLog struct {
	mu   sync.Mutex
	path string
	f    *os.File
	size int64
	log  func(msg string, args ...any)
}

func openAudit(path string, warn func(msg string, args ...any)) (*auditLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return &auditLog{path: path, f: f, size: st.Size(), log: warn}, nil
}

// auditLine is an entry as written.
type auditLine struct {
	Time      string `json:"time"`
	Principal string `json:"principal"`
	Remote    string `json:"remote"`
	Vhost     string `json:"vhost"`
	Action    string `json:"action"`
	Resource  string `json:"resource,omitempty"`
	Outcome   string `json:"outcome"`
	Message   string `json:"message,omitempty"`
}

// write appends one entry (called from many goroutines).
func (a *auditLog) write(ev netio.AuditEvent) {
	who := ev.Principal
	if who == "" {
		who = "anonymous"
	}
	b, _ := json.Marshal(auditLine{Time: ev.Time.UTC().Format(time.RFC3339Nano), Principal: who, Remote: ev.Remote, Vhost: ev.Vhost,
		Action: ev.Action, Resource: ev.Resource, Outcome: ev.Outcome, Message: ev.Message})
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return
	}
	if a.size+int64(len(b)) > auditMaxBytes {
		a.rotate()
	}
	n, err := a.f.Write(b)
	a.size += int64(n)
	if err != nil {
		mAudit.WithLabelValues("dropped").Inc()
		a.log("audit log write failed", "path", a.path, "err", err)
		return
	}
	mAudit.WithLabelValues(ev.Outcome).Inc()
}

// rotate moves the file to PATH.1 and starts a new one (a.mu held).
func (a *auditLog) rotate() {
	_ = a.f.Sync()
	_ = a.f.Close()
	if err := os.Rename(a.path, a.path+".1"); err != nil {
		a.log("audit log rotation failed", "path", a.path, "err", err)
	}
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		a.log("audit log reopen failed", "path", a.path, "err", err)
		a.f = nil
		return
	}
	a.f, a.size = f, 0
}

func (a *auditLog) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f != nil {
		_ = a.f.Sync()
		_ = a.f.Close()
		a.f = nil
	}
}

// auditPath is where the audit log goes: --audit-log, "" for none, or
// DATA/audit.log when logins are on and it is not set.
func (b *Broker) auditPath() string {
	switch b.cfg.AuditLog {
	case "off":
		return ""
	case "":
		if b.cfg.authMode == auth.Off {
			return ""
		}
		return filepath.Join(b.cfg.DataDir, "audit.log")
	}
	return b.cfg.AuditLog
}

// auditHook is netio's audit hook, or nil without an audit log.
func (b *Broker) auditHook() func(netio.AuditEvent) {
	if b.audit == nil {
		return nil
	}
	return b.audit.write
}
