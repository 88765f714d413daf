// Package scenario holds the chaos suite's scenarios as data: the cluster's
// shape, the workload, the nemesis schedule and the checks, one JSON file
// each in scenarios/ (embedded in the binary). Adding a scenario is adding
// a file; this package parses and validates them and turns a random
// schedule into a timeline with a seed. It does no I/O beyond reading the
// embedded files.
package scenario

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
)

// Scenario is one chaos scenario.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Nodes in the cluster (default 3).
	Nodes int `json:"nodes,omitempty"`
	// NetNS: the scenario needs each node in its own network namespace
	// (network nemeses); it is skipped with a clear message where they
	// cannot be made.
	NetNS bool `json:"netns,omitempty"`
	// Duration of the faulted part of the run (default 60s); the run then
	// heals every fault and drains for Settle (default 10s).
	Duration Duration `json:"duration,omitempty"`
	Settle   Duration `json:"settle,omitempty"`
	// CI: part of the subset .ci/run runs.
	CI bool `json:"ci,omitempty"`
	// BrokerArgs are extra `herald serve` flags for every node.
	BrokerArgs []string `json:"broker_args,omitempty"`
	Topic      Topic    `json:"topic"`
	Workload   Workload `json:"workload"`
	Nemesis    Nemesis  `json:"nemesis"`
	// Goals are availability figures the run reports as missed when
	// exceeded (they are not violations of a promise).
	Goals Goals `json:"goals,omitempty"`
}

// Goals: for every fault, writes stop for at most Unavailable while it is
// on, and resume within Recovery of its end (0 = no goal).
type Goals struct {
	Unavailable Duration `json:"unavailable,omitempty"`
	Recovery    Duration `json:"recovery,omitempty"`
}

// MaxClockOffset is the largest clock jump (either way) of the scenario's
// faults, 0 without any.
func (s *Scenario) MaxClockOffset() time.Duration {
	var m time.Duration
	for _, st := range s.Nemesis.Timeline {
		m = max(m, st.Offset.D(), -st.Offset.D())
	}
	for _, f := range s.Nemesis.Faults {
		m = max(m, f.Offset.D(), -f.Offset.D())
	}
	return m
}

// Uses reports whether the scenario's nemesis has faults of kind.
func (s *Scenario) Uses(kind string) bool {
	for _, st := range s.Nemesis.Timeline {
		if st.Kind == kind {
			return true
		}
	}
	for _, f := range s.Nemesis.Faults {
		if f.Kind == kind {
			return true
		}
	}
	return false
}

// Topic is the topic the workload uses.
type Topic struct {
	Name        string `json:"name,omitempty"`        // default "chaos"
	Partitions  int    `json:"partitions,omitempty"`  // default 3
	Replication int    `json:"replication,omitempty"` // default min(3, nodes)
}

// Workload is what the clients do during the run.
type Workload struct {
	// Producers send unique, numbered records at Rate records/s each
	// (default 200) with Acks (all|leader, default all), idempotent or
	// not, keyed over Keys keys (0 = unkeyed).
	Producers  int    `json:"producers,omitempty"`
	Rate       int    `json:"rate,omitempty"`
	Acks       string `json:"acks,omitempty"`
	Idempotent bool   `json:"idempotent,omitempty"`
	Keys       int    `json:"keys,omitempty"`
	// PlainProducers are further producers, like the others but never
	// idempotent, so that one run mixes both kinds.
	PlainProducers int `json:"plain_producers,omitempty"`
	// Pull: one consumer reads every partition by offset.
	Pull bool `json:"pull,omitempty"`
	// Groups of push consumers.
	Groups []Group `json:"groups,omitempty"`
	// Delayed messages: Rate per second, each due Delay after it is sent.
	Delayed *Delayed `json:"delayed,omitempty"`
	// Requests: request-reply calls per second through the broker.
	Requests *Requests `json:"requests,omitempty"`
	// Halves: half (transactional) messages per second, ended by their
	// producer or left to a check-back.
	Halves *Halves `json:"halves,omitempty"`
	// Txns: transactions across partitions per second, each of Size
	// records (default 4), four in five committed, one aborted.
	Txns *Txns `json:"txns,omitempty"`
}

// Group is a consumer group of Members push consumers in Mode
// (clustering, shared, key-shared or broadcast). In shared mode, a Fail
// share of deliveries is nacked; MaxDeliveries then sends a message to the
// dead-letter topic.
type Group struct {
	Name          string  `json:"name"`
	Mode          string  `json:"mode"`
	Members       int     `json:"members,omitempty"` // default 2
	Fail          float64 `json:"fail,omitempty"`
	MaxDeliveries int     `json:"max_deliveries,omitempty"`
}

// Delayed is the delayed-message workload.
type Delayed struct {
	Rate  int      `json:"rate"`
	Delay Duration `json:"delay"`
}

// Halves is the half-message workload: Rate halves per second to the
// topic, of which 7 in 10 are committed by their producer, 2 in 10 rolled
// back, and 1 in 10 left for the check-back (which commits half of those),
// each first checked CheckInterval after it is stored (default 1s).
type Halves struct {
	Rate          int      `json:"rate"`
	CheckInterval Duration `json:"check_interval,omitempty"`
}

// Txns is the transaction workload; Timeout is the transactions' timeout
// (default 10s).
type Txns struct {
	Rate    int      `json:"rate"`
	Size    int      `json:"size,omitempty"`
	Timeout Duration `json:"timeout,omitempty"`
	// WrittenOnce: the producer writes its transactions once, straight to
	// the partitions (client.WithTxnWrittenOnce), instead of staging them.
	WrittenOnce bool `json:"written_once,omitempty"`
}

// Requests is the request-reply workload.
type Requests struct {
	Rate int `json:"rate"`
}

// Nemesis is the fault schedule: a fixed Timeline, or (Random) faults
// drawn with the run's seed from Faults, one at a time, each lasting
// between its For and ForMax, with Quiet between them.
type Nemesis struct {
	Timeline []Step   `json:"timeline,omitempty"`
	Random   bool     `json:"random,omitempty"`
	Faults   []Fault  `json:"faults,omitempty"`
	Quiet    Duration `json:"quiet,omitempty"` // default 5s
}

// Step is one fault of a fixed timeline, At after the start.
type Step struct {
	At Duration `json:"at"`
	Fault
}

// Fault is a fault, on a target, lasting For (up to ForMax when drawn at
// random; 0 = an instant fault such as a restart).
type Fault struct {
	Kind   string   `json:"kind"`
	Target string   `json:"target,omitempty"` // default "random"
	For    Duration `json:"for,omitempty"`
	ForMax Duration `json:"for_max,omitempty"`
	// Offset for a clock jump ("30s", "-30s"); Delay for a slow disk.
	Offset Duration `json:"offset,omitempty"`
	Delay  Duration `json:"delay,omitempty"`
}

// Kinds are the fault kinds, with whether each needs network namespaces.
var Kinds = map[string]bool{
	"kill": false, "pause": false, "rolling-restart": false,
	"isolate": true, "partition-minority": true, "partition-majority": true, "bridge": true, "flap": true,
	"slow-disk": false, "fsync-eio": false, "disk-full": false,
	"torn-tail": false, "bitflip": false, "truncate-segment": false,
	"clock-jump": false, "scheduler-clock-step": false,
	"add-node": false, "remove-node": false, "move-replicas": false,
}

// Targets are the targets a fault may name; "node:N" names node N.
// "leader" and "follower" are of the topic's partition 0;
// "leader-not-scheduler" is the leader of a partition of the topic on a
// node that does not run the scheduler (the __schedule leader).
var Targets = []string{"random", "leader", "follower", "leader-not-scheduler", "controller", "txn-coordinator", "majority", "minority", "all"}

// Modes are the consumer group modes.
var Modes = []string{"clustering", "shared", "key-shared", "broadcast"}

// Duration is a time.Duration written as a Go duration string in JSON.
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes d as "10s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "10s" (or a number of nanoseconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if json.Unmarshal(b, &n) != nil {
			return fmt.Errorf("duration %s: want a string such as \"10s\"", b)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// ErrInvalid marks a scenario that fails validation; the error lists every
// problem.
var ErrInvalid = errors.New("herald: invalid chaos scenario")

// Parse reads one scenario, rejecting unknown fields, fills its defaults
// and validates it.
func Parse(b []byte) (*Scenario, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	s.defaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Scenario) defaults() {
	if s.Nodes == 0 {
		s.Nodes = 3
	}
	if s.Duration == 0 {
		s.Duration = Duration(60 * time.Second)
	}
	if s.Settle == 0 {
		s.Settle = Duration(10 * time.Second)
	}
	if s.Topic.Name == "" {
		s.Topic.Name = "chaos"
	}
	if s.Topic.Partitions == 0 {
		s.Topic.Partitions = 3
	}
	if s.Topic.Replication == 0 {
		s.Topic.Replication = min(3, s.Nodes)
	}
	w := &s.Workload
	if w.Rate == 0 {
		w.Rate = 200
	}
	if w.Acks == "" {
		w.Acks = "all"
	}
	for i := range w.Groups {
		if w.Groups[i].Members == 0 {
			w.Groups[i].Members = 2
		}
	}
	if s.Nemesis.Quiet == 0 {
		s.Nemesis.Quiet = Duration(5 * time.Second)
	}
	for i := range s.Nemesis.Timeline {
		if s.Nemesis.Timeline[i].Target == "" {
			s.Nemesis.Timeline[i].Target = "random"
		}
	}
	for i := range s.Nemesis.Faults {
		if s.Nemesis.Faults[i].Target == "" {
			s.Nemesis.Faults[i].Target = "random"
		}
	}
}

// Validate reports every problem of a scenario (with defaults filled).
func (s *Scenario) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if s.Name == "" || strings.ContainsAny(s.Name, " /\\") {
		bad("name %q: want a word such as leader-kill", s.Name)
	}
	if s.Nodes < 1 || s.Nodes > 9 {
		bad("nodes %d: want 1 to 9", s.Nodes)
	}
	if s.Topic.Partitions < 1 || s.Topic.Replication < 1 || s.Topic.Replication > s.Nodes {
		bad("topic: %d partitions with replication %d on %d nodes", s.Topic.Partitions, s.Topic.Replication, s.Nodes)
	}
	w := s.Workload
	if w.Producers < 0 || w.PlainProducers < 0 || w.Rate < 0 || w.Keys < 0 {
		bad("workload: negative producers, plain producers, rate or keys")
	}
	if w.Acks != "all" && w.Acks != "leader" {
		bad("workload acks %q: want all or leader (acks none is not checkable)", w.Acks)
	}
	for _, g := range w.Groups {
		if g.Name == "" || !slices.Contains(Modes, g.Mode) || g.Members < 1 || g.Fail < 0 || g.Fail >= 1 || g.MaxDeliveries < 0 {
			bad("group %+v: want a name, a mode of %s, members >= 1, fail in [0,1)", g, strings.Join(Modes, "|"))
		}
		if g.Fail > 0 && g.Mode != "shared" {
			bad("group %s: fail needs shared mode (per-message nacks)", g.Name)
		}
	}
	if d := w.Delayed; d != nil && (d.Rate < 1 || d.Delay <= 0) {
		bad("delayed: want rate >= 1 and a positive delay")
	}
	if r := w.Requests; r != nil && r.Rate < 1 {
		bad("requests: want rate >= 1")
	}
	if tx := w.Txns; tx != nil && (tx.Rate < 1 || tx.Size < 0 || tx.Size > 1000 || tx.Timeout < 0) {
		bad("txns: want rate >= 1, size 0 to 1000 and a timeout >= 0")
	}
	if h := w.Halves; h != nil && (h.Rate < 1 || h.CheckInterval < 0 || h.CheckInterval > 0 && h.CheckInterval.D() < 100*time.Millisecond) {
		bad("halves: want rate >= 1 and a check interval of at least 100ms (or none)")
	}
	n := s.Nemesis
	if n.Random && len(n.Faults) == 0 {
		bad("nemesis: random needs faults to draw from")
	}
	if n.Random && len(n.Timeline) > 0 {
		bad("nemesis: either a timeline or random faults, not both")
	}
	check := func(where string, f Fault) {
		needNS, ok := Kinds[f.Kind]
		switch {
		case !ok:
			bad("%s: unknown fault kind %q (want one of %s)", where, f.Kind, strings.Join(kindNames(), ", "))
		case needNS && !s.NetNS:
			bad("%s: %s needs \"netns\": true", where, f.Kind)
		}
		if !validTarget(f.Target, s.Nodes) {
			bad("%s: target %q: want one of %s or node:1..%d", where, f.Target, strings.Join(Targets, ", "), s.Nodes)
		}
		if f.For < 0 || f.ForMax < 0 || f.ForMax > 0 && f.ForMax < f.For {
			bad("%s: want 0 <= for <= for_max", where)
		}
		if (f.Kind == "clock-jump" || f.Kind == "scheduler-clock-step") && f.Offset == 0 {
			bad("%s: a clock jump needs an offset", where)
		}
		if f.Kind == "slow-disk" && f.Delay <= 0 {
			bad("%s: a slow disk needs a delay", where)
		}
	}
	for i, st := range n.Timeline {
		if st.At < 0 || st.At.D()+st.For.D() > s.Duration.D() {
			bad("timeline step %d: at %v for %v does not fit in the duration %v", i, st.At.D(), st.For.D(), s.Duration.D())
		}
		check(fmt.Sprintf("timeline step %d", i), st.Fault)
	}
	for i, f := range n.Faults {
		check(fmt.Sprintf("fault %d", i), f)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w %q: %s", ErrInvalid, s.Name, strings.Join(probs, "; "))
	}
	return nil
}

func validTarget(t string, nodes int) bool {
	if slices.Contains(Targets, t) {
		return true
	}
	var n int
	if _, err := fmt.Sscanf(t, "node:%d", &n); err == nil && fmt.Sprintf("node:%d", n) == t {
		return n >= 1 && n <= nodes
	}
	return false
}

func kindNames() []string {
	var ks []string
	for k := range Kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Plan is the schedule of a run: the fixed timeline, or faults drawn from
// Faults with seed until the duration is used up.
func (s *Scenario) Plan(seed uint64) []Step {
	if !s.Nemesis.Random {
		steps := slices.Clone(s.Nemesis.Timeline)
		sort.SliceStable(steps, func(i, j int) bool { return steps[i].At < steps[j].At })
		return steps
	}
	r := rand.New(rand.NewPCG(seed, 0x6865726164)) //nolint:gosec // a reproducible schedule, not a secret
	var steps []Step
	at := s.Nemesis.Quiet.D()
	for {
		f := s.Nemesis.Faults[r.IntN(len(s.Nemesis.Faults))]
		d := f.For.D()
		if f.ForMax > f.For {
			d += time.Duration(r.Int64N(int64(f.ForMax - f.For)))
		}
		if at+d > s.Duration.D() {
			return steps
		}
		f.For, f.ForMax = Duration(d), 0
		steps = append(steps, Step{At: Duration(at), Fault: f})
		at += d + s.Nemesis.Quiet.D()
	}
}

//go:embed scenarios/*.json
var files embed.FS

// All returns the embedded scenarios, sorted by name. A file that does not
// parse is an error naming it (a test keeps them valid).
func All() ([]*Scenario, error) {
	ents, err := files.ReadDir("scenarios")
	if err != nil {
		return nil, err
	}
	var out []*Scenario
	for _, e := range ents {
		b, err := files.ReadFile(path.Join("scenarios", e.Name()))
		if err != nil {
			return nil, err
		}
		s, err := Parse(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		if want := strings.TrimSuffix(e.Name(), ".json"); s.Name != want {
			return nil, fmt.Errorf("%s: %w: name %q differs from the file's", e.Name(), ErrInvalid, s.Name)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ErrUnknown is returned by Find for a name no scenario has.
var ErrUnknown = errors.New("herald: no such chaos scenario")

// Find returns the embedded scenario called name.
func Find(name string) (*Scenario, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	for _, s := range all {
		if s.Name == name {
			return s, nil
		}
	}
	var names []string
	for _, s := range all {
		names = append(names, s.Name)
	}
	return nil, fmt.Errorf("%w %q (have: %s)", ErrUnknown, name, strings.Join(names, ", "))
}
