package adminapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// NodeInfo is a registered node as the node running the API knows it.
type NodeInfo struct {
	ID             uint64
	ClientAddress  string
	ClusterAddress string
	HealthAddress  string // where it is probed ("" on a single node)
	Rack           string
	Version        string
	StartedMs      int64
	Decommissioned bool
}

// Membership is the node's own knowledge of the cluster.
type Membership struct {
	Self      uint64
	Clustered bool
	Nodes     []NodeInfo      // registered nodes; on a single node, itself
	Members   map[uint64]bool // the nodes in its membership view now
	// The controller group: its leader (0: none known), voters and
	// learners.
	ControllerLeader uint64
	Voters, Learners []uint64
}

// Node is the broker the API runs in.
type Node interface {
	Membership() Membership
	// SchedulerLateness is the scheduler's fire-lateness histogram
	// (cumulative since the process started) when the scheduler runs on
	// this node; ok false otherwise.
	SchedulerLateness() (h Histogram, ok bool)
}

// Histogram is a cumulative histogram: Counts[i] observations at most
// Bounds[i] seconds, Count in all.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
}

// Config configures a Server.
type Config struct {
	Node Node
	// Dial returns a client of this node for a user of the admin port
	// (user and password "" when logins are off).
	Dial func(ctx context.Context, user, password string) (*client.Client, error)
	// ReadOnly refuses every action (--admin-read-only).
	ReadOnly bool
	// Interval between refreshes while someone watches (default 1 s).
	Interval time.Duration
	Logger   *slog.Logger
}

// Bounds.
const (
	maxViews        = 32               // users with a view at once; the least recently used idle one goes
	viewIdle        = 5 * time.Minute  // a view nobody used this long is closed
	watchLinger     = 30 * time.Second // refreshing goes on this long after the last request
	maxWatchers     = 64               // event streams at once
	probeTimeout    = 800 * time.Millisecond
	probeDownStreak = 1 // refused connections in a row before "down"
	maxActionBody   = 64 << 10
	snapshotMaxAge  = 1500 * time.Millisecond
)

// Server serves /api/v1 and the dashboard.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	views    map[string]*view
	states   map[uint64]stateSince
	watchers int
	late     []latenessSample // the scheduler's lateness, one sample a refresh, the last minute
	probing  bool             // prober running
	probed   time.Time        // states last resolved
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

type stateSince struct {
	state string
	since time.Time
	note  string
}

// view is one user's client and what it read last.
type view struct {
	key      string
	user, pw string

	mu       sync.Mutex // one refresh at a time
	c        *client.Client
	hist     *history
	last     *Snapshot
	lastJSON []byte
	used     time.Time
	watching int
	changed  chan struct{} // closed when last changes
	running  bool
}

// New returns a Server; Close stops its refreshes.
func New(cfg Config) *Server {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Logger, views: map[string]*view{}, states: map[uint64]stateSince{}, stop: make(chan struct{})}
}

// Close stops the refreshes and closes the views' clients.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.stop)
	views := s.views
	s.views = map[string]*view{}
	s.mu.Unlock()
	s.wg.Wait()
	for _, v := range views {
		v.mu.Lock()
		if v.c != nil {
			_ = v.c.Close()
		}
		v.mu.Unlock()
	}
}

// Register mounts the API and the dashboard on mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/cluster", s.read(func(sn *Snapshot, _ *http.Request) (any, error) { return sn.Cluster, nil }))
	mux.HandleFunc("GET /api/v1/topics", s.read(func(sn *Snapshot, _ *http.Request) (any, error) {
		out := struct {
			ViewOf uint64         `json:"view_of"`
			Topics []TopicSummary `json:"topics"`
			Stale  string         `json:"stale,omitempty"`
			At     time.Time      `json:"at"`
		}{ViewOf: sn.Cluster.ViewOf, Topics: []TopicSummary{}, Stale: sn.Cluster.Stale, At: sn.At}
		for _, t := range sn.Topics {
			out.Topics = append(out.Topics, t.TopicSummary)
		}
		return out, nil
	}))
	mux.HandleFunc("GET /api/v1/topics/{name}", s.read(func(sn *Snapshot, r *http.Request) (any, error) {
		name := r.PathValue("name")
		for _, t := range sn.Topics {
			if t.Name == name {
				return t, nil
			}
		}
		return nil, apiError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", name)
	}))
	mux.HandleFunc("GET /api/v1/groups", s.read(func(sn *Snapshot, _ *http.Request) (any, error) {
		out := struct {
			ViewOf uint64         `json:"view_of"`
			Groups []GroupSummary `json:"groups"`
			At     time.Time      `json:"at"`
		}{ViewOf: sn.Cluster.ViewOf, Groups: []GroupSummary{}, At: sn.At}
		for _, g := range sn.Groups {
			out.Groups = append(out.Groups, g.GroupSummary)
		}
		return out, nil
	}))
	mux.HandleFunc("GET /api/v1/groups/{name}", s.read(func(sn *Snapshot, r *http.Request) (any, error) {
		name := r.PathValue("name")
		for _, g := range sn.Groups {
			if g.Name == name {
				return g, nil
			}
		}
		return nil, apiError(heraldpb.ErrorCode_GROUP_NOT_FOUND, "consumer group %q does not exist", name)
	}))
	mux.HandleFunc("GET /api/v1/scheduler", s.read(func(sn *Snapshot, _ *http.Request) (any, error) {
		if sn.Scheduler == nil {
			return nil, apiError(heraldpb.ErrorCode_NOT_READY, "the scheduler could not be read: %s", strings.Join(sn.Errors, "; "))
		}
		return sn.Scheduler, nil
	}))
	mux.HandleFunc("GET /api/v1/alerts", s.read(func(sn *Snapshot, _ *http.Request) (any, error) {
		return Alerts{ViewOf: sn.Cluster.ViewOf, Alerts: sn.Alerts, At: sn.At}, nil
	}))
	mux.HandleFunc("GET /api/v1/events", s.events)
	mux.HandleFunc("DELETE /api/v1/topics/{name}", s.action(s.deleteTopic))
	mux.HandleFunc("POST /api/v1/groups/{name}/reset", s.action(s.resetGroup))
	mux.HandleFunc("POST /api/v1/topics/{name}/partitions/{partition}/move", s.action(s.moveReplica))
	mux.HandleFunc("POST /api/v1/groups/{name}/dlq/redrive", s.action(s.redriveDLQ))
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		body := errorBody(apiError(heraldpb.ErrorCode_INVALID_REQUEST, "no such API call: %s %s (see docs/admin-api.md)", r.Method, r.URL.Path))
		writeJSON(w, http.StatusNotFound, body)
	})
	s.registerUI(mux)
}

// ---- views ----------------------------------------------------------------

// viewFor returns the view of r's user, creating it.
func (s *Server) viewFor(r *http.Request) (*view, error) {
	user, pw, _ := r.BasicAuth()
	sum := sha256.Sum256([]byte(user + "\x00" + pw))
	key := string(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, apiError(heraldpb.ErrorCode_NOT_READY, "the admin API is stopping")
	}
	v := s.views[key]
	if v == nil {
		if len(s.views) >= maxViews {
			var oldest *view
			for _, o := range s.views {
				if o.watching == 0 && (oldest == nil || o.used.Before(oldest.used)) {
					oldest = o
				}
			}
			if oldest == nil {
				return nil, apiError(heraldpb.ErrorCode_THROTTLED, "%d users are watching the admin API: the most it serves at once", maxViews)
			}
			s.dropLocked(oldest)
		}
		v = &view{key: key, user: user, pw: pw, hist: newHistory(), changed: make(chan struct{})}
		s.views[key] = v
	}
	v.used = time.Now()
	if !v.running {
		v.running = true
		s.wg.Add(1)
		go s.loop(v)
	}
	if !s.probing {
		s.probing = true
		s.wg.Add(1)
		go s.prober()
	}
	return v, nil
}

func (s *Server) dropLocked(v *view) {
	delete(s.views, v.key)
	go func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.c != nil {
			_ = v.c.Close()
			v.c = nil
		}
	}()
}

// loop refreshes v every interval while it is watched or was used in
// the last watchLinger; it ends then (the next request starts it again),
// and closes the view after viewIdle.
func (s *Server) loop(v *view) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.mu.Lock()
		idle := v.watching == 0 && time.Since(v.used) > watchLinger
		if idle {
			v.running = false
		}
		s.mu.Unlock()
		if idle {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = s.refresh(ctx, v)
		cancel()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// snapshot returns v's last snapshot, refreshing it first when it is
// older than snapshotMaxAge.
func (s *Server) snapshot(ctx context.Context, v *view) (*Snapshot, error) {
	v.mu.Lock()
	last := v.last
	v.mu.Unlock()
	if last != nil && time.Since(last.At) < snapshotMaxAge {
		return last, nil
	}
	return s.refresh(ctx, v)
}

// refresh reads a new snapshot for v.
func (s *Server) refresh(ctx context.Context, v *view) (*Snapshot, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.last != nil && time.Since(v.last.At) < s.cfg.Interval/2 {
		return v.last, nil // another caller just did
	}
	if v.c == nil {
		c, err := s.cfg.Dial(ctx, v.user, v.pw)
		if err != nil {
			return nil, err
		}
		v.c = c
	}
	ctx, cancel := context.WithTimeout(ctx, refreshBudget)
	defer cancel()
	ms := s.cfg.Node.Membership()
	states := s.statesFor(ctx, ms)
	sn := s.build(ctx, v.c, v.hist, ms, states)
	v.last = sn
	b, _ := json.Marshal(sn)
	if !bytes.Equal(withoutTimes(b), withoutTimes(v.lastJSON)) {
		close(v.changed)
		v.changed = make(chan struct{})
	}
	v.lastJSON = b
	return sn, nil
}

// withoutTimes drops the snapshot's own time, so that a snapshot that
// says nothing new is not sent again.
func withoutTimes(b []byte) []byte {
	if i := bytes.LastIndex(b, []byte(`,"at":"`)); i >= 0 {
		return b[:i]
	}
	return b
}

// ---- membership --------------------------------------------------------

// prober resolves the nodes' states every interval while any view is
// refreshed, apart from the refreshes: a refresh slowed by a paused node
// still shows the states of a second ago.
func (s *Server) prober() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.mu.Lock()
		busy := false
		for _, v := range s.views {
			busy = busy || v.running
		}
		if !busy {
			s.probing = false
		}
		s.mu.Unlock()
		if !busy {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*probeTimeout)
		s.probe(ctx, s.cfg.Node.Membership())
		cancel()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// statesFor returns the nodes' states: the prober's, unless they are
// older than two intervals (or for nodes it has not seen), then probed now.
func (s *Server) statesFor(ctx context.Context, ms Membership) map[uint64]stateSince {
	s.mu.Lock()
	fresh := time.Since(s.probed) < 2*s.cfg.Interval
	out := map[uint64]stateSince{}
	for _, nd := range ms.Nodes {
		st, ok := s.states[nd.ID]
		fresh = fresh && ok
		out[nd.ID] = st
	}
	s.mu.Unlock()
	if fresh {
		return out
	}
	return s.probe(ctx, ms)
}

// probe resolves every registered node's state, and when it entered it.
func (s *Server) probe(ctx context.Context, ms Membership) map[uint64]stateSince {
	type res struct {
		id     uint64
		answer probeAnswer
	}
	ch := make(chan res, len(ms.Nodes))
	n := 0
	for _, nd := range ms.Nodes {
		if nd.ID == ms.Self || nd.HealthAddress == "" || nd.Decommissioned {
			continue
		}
		n++
		go func() { ch <- res{nd.ID, probeNode(ctx, nd.HealthAddress)} }()
	}
	answers := map[uint64]probeAnswer{}
	for range n {
		r := <-ch
		answers[r.id] = r.answer
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probed = now
	out := map[uint64]stateSince{}
	for _, nd := range ms.Nodes {
		state, note := StateAlive, ""
		switch a := answers[nd.ID]; {
		case nd.Decommissioned:
			state, note = StateLeft, "removed from the cluster (herald cluster remove-node)"
		case nd.ID == ms.Self || !ms.Clustered:
		case a == probeRefused:
			state, note = StateDown, fmt.Sprintf("node %d refuses connections at %s", nd.ID, nd.HealthAddress)
		case a == probeSlow && !ms.Members[nd.ID]:
			state, note = StateDown, fmt.Sprintf("no answer from node %d within %v, and not a member of node %d's view", nd.ID, probeTimeout, ms.Self)
		case a == probeSlow:
			state, note = StateSuspect, fmt.Sprintf("no answer from node %d within %v", nd.ID, probeTimeout)
		case !ms.Members[nd.ID]:
			state, note = StateSuspect, fmt.Sprintf("node %d answers but is not a member of node %d's view", nd.ID, ms.Self)
		}
		st, ok := s.states[nd.ID]
		if !ok || st.state != state {
			st = stateSince{state: state, since: now}
		}
		st.note = note
		s.states[nd.ID] = st
		out[nd.ID] = st
	}
	return out
}

type probeAnswer int

const (
	probeOK probeAnswer = iota
	probeRefused
	probeSlow
)

// probeNode asks a node's health endpoint: a refused connection is a
// process gone; one that accepts but does not answer within probeTimeout
// is paused or overloaded; any answer is alive.
func probeNode(ctx context.Context, addr string) probeAnswer {
	d := net.Dialer{Timeout: probeTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return probeSlow
		}
		return probeRefused
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := fmt.Fprintf(conn, "GET /_health HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return probeRefused
	}
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return probeSlow
		}
	}
	return probeOK
}

// ---- handlers ------------------------------------------------------------

// read serves a GET from the user's snapshot.
func (s *Server) read(fn func(*Snapshot, *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := s.viewFor(r)
		if err != nil {
			writeError(w, err)
			return
		}
		sn, err := s.snapshot(r.Context(), v)
		if err != nil {
			writeError(w, err)
			return
		}
		out, err := fn(sn, r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// action serves a change: refused in read-only mode, done with the
// user's client.
func (s *Server) action(fn func(context.Context, *client.Client, *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ReadOnly {
			writeError(w, apiError(heraldpb.ErrorCode_NOT_AUTHORIZED, "the admin API is read-only (--admin-read-only)"))
			return
		}
		if err := sameOrigin(r); err != nil {
			writeError(w, err)
			return
		}
		v, err := s.viewFor(r)
		if err != nil {
			writeError(w, err)
			return
		}
		v.mu.Lock()
		if v.c == nil {
			c, err := s.cfg.Dial(r.Context(), v.user, v.pw)
			if err != nil {
				v.mu.Unlock()
				writeError(w, err)
				return
			}
			v.c = c
		}
		c := v.c
		v.mu.Unlock()
		r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		out, err := fn(ctx, c, r)
		if err != nil {
			writeError(w, err)
			return
		}
		v.mu.Lock()
		v.last = nil // the next read shows the change
		v.mu.Unlock()
		s.log.Info("admin API action", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, out)
	}
}

// ActionHeader must be on every action: a page of another site cannot
// set it without the admin port's consent (which it never gives: no CORS),
// so a browser holding the admin port's login cannot be made to act by
// another site (cross-site request forgery).
const ActionHeader = "X-Herald-Action"

// sameOrigin refuses an action sent without ActionHeader, or from a page
// of another origin.
func sameOrigin(r *http.Request) error {
	if r.Header.Get(ActionHeader) == "" {
		return apiError(heraldpb.ErrorCode_INVALID_REQUEST, "an action needs the header %s: 1 (a guard against cross-site requests)", ActionHeader)
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return apiError(heraldpb.ErrorCode_NOT_AUTHORIZED, "an action from origin %q, not from this admin port (%s)", o, r.Host)
		}
	}
	return nil
}

// deleteTopic is DELETE /api/v1/topics/{name}?confirm={name}.
func (s *Server) deleteTopic(ctx context.Context, c *client.Client, r *http.Request) (any, error) {
	name := r.PathValue("name")
	if r.URL.Query().Get("confirm") != name {
		return nil, apiError(heraldpb.ErrorCode_INVALID_REQUEST, "deleting a topic needs ?confirm=%s (its name again)", name)
	}
	if err := c.DeleteTopic(ctx, name); err != nil {
		return nil, err
	}
	return map[string]any{"deleted": name}, nil
}

// MoveRequest is the body of POST /api/v1/topics/{name}/partitions/{p}/move:
// the replica on node From moves to node To.
type MoveRequest struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

// moveReplica is POST /api/v1/topics/{name}/partitions/{partition}/move.
func (s *Server) moveReplica(ctx context.Context, c *client.Client, r *http.Request) (any, error) {
	part, err := strconv.ParseUint(r.PathValue("partition"), 10, 32)
	if err != nil {
		return nil, apiError(heraldpb.ErrorCode_INVALID_REQUEST, "partition %q is not a non-negative integer", r.PathValue("partition"))
	}
	var req MoveRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if req.From == 0 || req.To == 0 {
		return nil, apiError(heraldpb.ErrorCode_INVALID_REQUEST, "the body must name both nodes, like {\"from\":3,\"to\":4}")
	}
	resp, err := c.ClusterAdmin(ctx, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_MOVE_REPLICA,
		Topic: r.PathValue("name"), Partition: uint32(part), NodeId: req.From, ToNode: req.To})
	if err != nil {
		return nil, err
	}
	type move struct {
		Topic     string   `json:"topic"`
		Partition uint32   `json:"partition"`
		From      []uint32 `json:"from"`
		To        []uint32 `json:"to"`
	}
	out := struct {
		Moves []move `json:"moves"`
	}{Moves: []move{}}
	for _, mv := range resp.GetMoves() {
		out.Moves = append(out.Moves, move{mv.GetTopic(), mv.GetPartition(), mv.GetFrom(), mv.GetTo()})
	}
	return out, nil
}

// decodeBody decodes r's JSON body into v, refusing unknown fields.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiError(heraldpb.ErrorCode_INVALID_REQUEST, "the body is not the JSON this call takes (docs/admin-api.md): %v", err)
	}
	return nil
}

// ResetRequest is the body of POST /api/v1/groups/{name}/reset.
type ResetRequest struct {
	// To: "earliest", "latest", "offset:N" or "time:RFC3339".
	To         string  `json:"to"`
	Force      bool    `json:"force"`
	Partitions []int32 `json:"partitions,omitempty"`
}

// resetGroup is POST /api/v1/groups/{name}/reset.
func (s *Server) resetGroup(ctx context.Context, c *client.Client, r *http.Request) (any, error) {
	var req ResetRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	to, err := ParsePosition(req.To)
	if err != nil {
		return nil, apiError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	gi, err := c.ResetGroup(ctx, r.PathValue("name"), to, req.Force, req.Partitions...)
	if err != nil {
		return nil, err
	}
	b, err := pj.Marshal(gi)
	if err != nil {
		return nil, err
	}
	return map[string]json.RawMessage{"group": b}, nil
}

// ParsePosition parses "earliest", "latest", "offset:N" or "time:RFC3339".
func ParsePosition(s string) (client.StartPosition, error) {
	switch kind, arg, hasArg := strings.Cut(s, ":"); {
	case kind == "earliest" && !hasArg:
		return client.Earliest(), nil
	case kind == "latest" && !hasArg:
		return client.Latest(), nil
	case kind == "offset":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 0 {
			return client.StartPosition{}, fmt.Errorf("offset %q is not a non-negative integer", arg)
		}
		return client.AtOffset(n), nil
	case kind == "time":
		t, err := time.Parse(time.RFC3339, arg)
		if err != nil {
			return client.StartPosition{}, fmt.Errorf("time %q is not RFC 3339 (2026-12-02T15:04:05Z)", arg)
		}
		return client.AtTime(t), nil
	}
	return client.StartPosition{}, fmt.Errorf("position %q: want earliest, latest, offset:N or time:RFC3339", s)
}

// events is GET /api/v1/events: the snapshot as Server-Sent Events, sent
// again whenever it changes (checked every interval).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, apiError(heraldpb.ErrorCode_INTERNAL, "streaming is not supported here"))
		return
	}
	v, err := s.viewFor(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	if s.watchers >= maxWatchers {
		s.mu.Unlock()
		writeError(w, apiError(heraldpb.ErrorCode_THROTTLED, "%d event streams are open: the most the admin API serves at once", maxWatchers))
		return
	}
	s.watchers++
	v.watching++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.watchers--
		v.watching--
		v.used = time.Now()
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	var sent []byte
	for {
		if _, err := s.snapshot(r.Context(), v); err != nil {
			e := errorBody(err)
			b, _ := json.Marshal(e)
			fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
			fl.Flush()
		}
		v.mu.Lock()
		b, changed := v.lastJSON, v.changed
		v.mu.Unlock()
		if b != nil && !bytes.Equal(b, sent) {
			if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
			sent = b
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.stop:
			return
		case <-changed:
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return
			}
			fl.Flush()
		case <-time.After(2 * s.cfg.Interval):
		}
	}
}

// ---- errors ----------------------------------------------------------------

// apiErr is an error with the protocol's code.
type apiErr struct {
	code heraldpb.ErrorCode
	msg  string
}

func (e *apiErr) Error() string { return e.code.String() + ": " + e.msg }

func apiError(code heraldpb.ErrorCode, format string, args ...any) error {
	return &apiErr{code: code, msg: fmt.Sprintf(format, args...)}
}

func errorBody(err error) (body ErrorBody) {
	var ae *apiErr
	var ce *client.Error
	switch {
	case errors.As(err, &ae):
		body.Error.Code, body.Error.Message = ae.code.String(), ae.msg
	case errors.As(err, &ce):
		body.Error.Code, body.Error.Message = ce.Code.String(), ce.Message
	case errors.Is(err, context.DeadlineExceeded):
		body.Error.Code, body.Error.Message = heraldpb.ErrorCode_TIMEOUT.String(), err.Error()
	default:
		body.Error.Code, body.Error.Message = heraldpb.ErrorCode_INTERNAL.String(), err.Error()
	}
	return body
}

// statusOf maps a code to an HTTP status.
func statusOf(code string) int {
	switch code {
	case "TOPIC_NOT_FOUND", "GROUP_NOT_FOUND", "TXN_NOT_FOUND", "USER_NOT_FOUND", "VHOST_NOT_FOUND":
		return http.StatusNotFound
	case "INVALID_REQUEST", "INVALID_CONFIG", "INVALID_FILTER":
		return http.StatusBadRequest
	case "NOT_AUTHENTICATED":
		return http.StatusUnauthorized
	case "NOT_AUTHORIZED":
		return http.StatusForbidden
	case "GROUP_HAS_MEMBERS", "TOPIC_ALREADY_EXISTS":
		return http.StatusConflict
	case "THROTTLED", "QUOTA_EXCEEDED":
		return http.StatusTooManyRequests
	case "NODE_NOT_FOUND":
		return http.StatusNotFound
	case "NOT_READY", "TIMEOUT", "NOT_LEADER", "NOT_COORDINATOR", "NOT_ENOUGH_REPLICAS":
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	body := errorBody(err)
	writeJSON(w, statusOf(body.Error.Code), body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
