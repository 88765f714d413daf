package broker

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/adminapi"
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
			refuseAdmin(w, r, http.StatusUnauthorized, "NOT_AUTHENTICATED", "log in: HTTP basic credentials of a herald user")
			ev.Outcome = "NOT_AUTHENTICATED"
			b.writeAudit(ev)
			return
		}
		ev.Principal = user
		if e := b.auth.CheckPassword(user, pw, r.RemoteAddr); e != nil {
			w.Header().Set("WWW-Authenticate", `Basic realm="herald"`)
			refuseAdmin(w, r, http.StatusUnauthorized, e.Code.String(), e.Message)
			ev.Outcome, ev.Message = e.Code.String(), e.Message
			b.writeAudit(ev)
			return
		}
		if e := b.auth.MayOnCluster(user, strings.HasPrefix(r.URL.Path, "/debug/")); e != nil {
			refuseAdmin(w, r, http.StatusForbidden, e.Code.String(), e.Message)
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

// refuseAdmin answers a refused admin request: JSON with the protocol's
// code under /api/, text elsewhere.
func refuseAdmin(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if !strings.HasPrefix(r.URL.Path, "/api/") {
		http.Error(w, msg, status)
		return
	}
	var body adminapi.ErrorBody
	body.Error.Code, body.Error.Message = code, msg
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
