package broker

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/netio"
)

// guardAdmin puts the admin port behind the logins: with --auth on, every
// path but --admin-open's needs HTTP basic credentials of a user (the
// same users, the same failed-login limiter), and the user needs describe
// on the cluster (admin for /debug/...). Each request past the open paths
// is written to the audit log.
func (b *Broker) guardAdmin(next http.Handler) http.Handler {
	open := splitList(b.cfg.AdminOpen)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.auth.Mode() == auth.Off || slices.Contains(open, r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		ev := netio.AuditEvent{Time: time.Now(), Remote: r.RemoteAddr, Vhost: "/", Action: "http " + r.Method + " " + r.URL.Path}
		user, pw, ok := r.BasicAuth()
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="herald"`)
			http.Error(w, "log in: HTTP basic credentials of a herald user", http.StatusUnauthorized)
			ev.Outcome = "NOT_AUTHENTICATED"
			b.writeAudit(ev)
			return
		}
		ev.Principal = user
		if e := b.auth.CheckPassword(user, pw, r.RemoteAddr); e != nil {
			w.Header().Set("WWW-Authenticate", `Basic realm="herald"`)
			http.Error(w, e.Message, http.StatusUnauthorized)
			ev.Outcome, ev.Message = e.Code.String(), e.Message
			b.writeAudit(ev)
			return
		}
		if e := b.auth.MayOnCluster(user, strings.HasPrefix(r.URL.Path, "/debug/")); e != nil {
			http.Error(w, e.Message, http.StatusForbidden)
			ev.Outcome, ev.Message = e.Code.String(), e.Message
			b.writeAudit(ev)
			return
		}
		ev.Outcome = "ok"
		b.writeAudit(ev)
		next.ServeHTTP(w, r)
	})
}

// writeAudit writes ev to the audit log, if there is one.
func (b *Broker) writeAudit(ev netio.AuditEvent) {
	if b.audit != nil {
		b.audit.write(ev)
	}
}
