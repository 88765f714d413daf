package consumer

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

// TestScenarios runs testdata/*.txt. Each file is a sequence of blocks:
//
//	# comments and blank lines between blocks are kept
//	command arg key=value ...
//	----
//	expected output (no blank lines)
//
// go test -run TestScenarios -rewrite regenerates the expected output. The
// commands are documented on (*scenario).run.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runFile(t, f) })
	}
}

func runFile(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out strings.Builder
	sc := &scenario{}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			out.WriteString(l + "\n")
			continue
		}
		cmd, at := l, i+1
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ---- line", path, at)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		i-- // the blank line (or EOF) is handled by the loop
		got := strings.TrimRight(sc.run(t, cmd), "\n")
		if got == "" {
			got = "ok"
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", cmd, got)
		if !*rewrite && got != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, at, cmd, got, strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// scenario drives one Sub with a fake log and clock.
type scenario struct {
	sub *Sub
	log [][]Message // per partition, offsets from 0
	t0  time.Time
	now time.Time
}

func (sc *scenario) rel(t time.Time) string {
	if t.IsZero() {
		return "any" // restored without a time: due at once
	}
	return t.Sub(sc.t0).String()
}

// run executes one command and returns its output. Commands:
//
//	sub mode=M partitions=N [start=O] [ack-timeout=D] [span=N] [pending=N] [orderly] [auto-ack]
//	    [retry=POLICY] [draw=U] [dlq-expired]
//	                                    POLICY is a retry policy with + for
//	                                    spaces (1s,5s+max-deliveries=3); U is
//	                                    every jitter draw (default 0)
//	join M... | leave M | die M         membership; prints the plan
//	revoked M [P...]                    confirm M's revokes (all when no P)
//	assign                              current and target assignment
//	produce p=P n=N [keys=a,b,...] [skip=I,J] [ttl=D] [prio=L,L2,...]
//	                                    append to the fake log (ttl: expires
//	                                    D after now; keys and prio cycle)
//	credits M N                         request(N)
//	deliver M [n=N]                     offer the log, then deliver to M;
//	                                    prints what expired too, and the
//	                                    priority of a delivery above 0
//	ack M O|P@O|P@O-O2...               acks; bare O means partition 0
//	nack M O|P@O [delay=D] [reason=R]   no delay: the retry policy's
//	commit M P@O
//	tick D                              advance the clock, expire acks
//	deadletters                         the dead letters waiting
//	deadlettered P@O...                 their appends are durable
//	restart                             encode, rebuild from the records
//	state
func (sc *scenario) run(t *testing.T, line string) string {
	f := strings.Fields(line)
	cmd, args := f[0], f[1:]
	kv := map[string]string{}
	var pos []string
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			kv[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	num := func(k string, def int) int {
		v, ok := kv[k]
		if !ok {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s: %s: %v", line, k, err)
		}
		return n
	}
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return d
	}
	errs := func(err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return ""
	}
	switch cmd {
	case "sub":
		mode, err := ParseMode(kv["mode"])
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Mode: mode, Partitions: num("partitions", 1), MaxSpan: num("span", 0),
			MaxPending: num("pending", 0), Orderly: slices.Contains(pos, "orderly"), AutoAck: slices.Contains(pos, "auto-ack"),
			DeadLetterExpired: slices.Contains(pos, "dlq-expired")}
		if r, ok := kv["retry"]; ok {
			if cfg.Retry, err = retry.ParsePolicy(strings.ReplaceAll(r, "+", " ")); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
		}
		draw := 0.0
		if u, ok := kv["draw"]; ok {
			if draw, err = strconv.ParseFloat(u, 64); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
		}
		cfg.Rand = func() float64 { return draw }
		if d, ok := kv["ack-timeout"]; ok {
			cfg.AckTimeout = dur(d)
		}
		start := make([]int64, cfg.Partitions)
		for p := range start {
			start[p] = int64(num("start", 0))
		}
		sc.sub, err = NewSub(cfg, start)
		if err != nil {
			t.Fatal(err)
		}
		sc.log = make([][]Message, cfg.Partitions)
		sc.t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		sc.now = sc.t0
		return ""
	case "join":
		var b strings.Builder
		for _, m := range pos {
			pl, err := sc.sub.Join(MemberID(m))
			b.WriteString(errs(err) + fmtPlan(pl))
		}
		return b.String()
	case "leave", "die":
		// The core treats both alike: a graceful leave has acked what it
		// could first; a death is noticed by the session actor.
		pl, err := sc.sub.Leave(MemberID(pos[0]), sc.now)
		return errs(err) + fmtPlan(pl)
	case "revoked":
		m := MemberID(pos[0])
		var ps []uint32
		if len(pos) > 1 {
			for _, s := range pos[1:] {
				n, _ := strconv.Atoi(s)
				ps = append(ps, uint32(n))
			}
		} else {
			ps = sc.sub.Assignor().Revoking(m)
		}
		var b strings.Builder
		for _, p := range ps {
			pl, err := sc.sub.Revoked(m, p, sc.now)
			b.WriteString(errs(err) + fmtPlan(pl))
		}
		return b.String()
	case "assign":
		return sc.fmtAssign()
	case "produce":
		p := num("p", 0)
		keys := strings.Split(kv["keys"], ",")
		skip := map[int]bool{}
		for _, s := range strings.Split(kv["skip"], ",") {
			if n, err := strconv.Atoi(s); err == nil {
				skip[n] = true
			}
		}
		var expires int64
		if d, ok := kv["ttl"]; ok {
			expires = sc.now.Add(dur(d)).UnixMilli()
		}
		prios := []uint8{0}
		if ps, ok := kv["prio"]; ok {
			prios = nil
			for _, s := range strings.Split(ps, ",") {
				n, err := strconv.ParseUint(s, 10, 8)
				if err != nil {
					t.Fatalf("%s: prio: %v", line, err)
				}
				prios = append(prios, uint8(n))
			}
		}
		first := len(sc.log[p])
		for i := 0; i < num("n", 1); i++ {
			off := len(sc.log[p])
			sc.log[p] = append(sc.log[p], Message{Partition: uint32(p), Offset: int64(off), Key: keys[i%len(keys)], Skip: skip[off], Expires: expires,
				Priority: prios[i%len(prios)]})
		}
		return fmt.Sprintf("p%d: %d-%d", p, first, len(sc.log[p])-1)
	case "credits":
		n, _ := strconv.Atoi(pos[1])
		return errs(sc.sub.Request(MemberID(pos[0]), n))
	case "deliver":
		sc.feed()
		ds, err := sc.sub.Deliver(MemberID(pos[0]), sc.now, num("n", 0))
		if err != nil {
			return errs(err)
		}
		var b strings.Builder
		for _, e := range sc.sub.TakeExpired() {
			fmt.Fprintf(&b, "expired %sp%d@%d #%d", viewPrefix(e.View), e.Partition, e.Offset, e.Count)
			if e.Dead {
				b.WriteString(" dead")
			}
			b.WriteByte('\n')
		}
		if len(ds) == 0 && b.Len() == 0 {
			return "none"
		}
		for _, d := range ds {
			b.WriteString(fmtDelivery(d))
			if pr := sc.log[d.Partition][d.Offset].Priority; pr > 0 {
				fmt.Fprintf(&b, " prio=%d", pr)
			}
			b.WriteByte('\n')
		}
		return b.String()
	case "ack", "nack", "commit":
		m := MemberID(pos[0])
		var b strings.Builder
		for _, a := range pos[1:] {
			p, lo, hi := parseRef(t, a)
			for off := lo; off <= hi; off++ {
				var err error
				switch cmd {
				case "ack":
					err = sc.sub.Ack(m, p, off)
				case "nack":
					delay := PolicyDelay
					if d, ok := kv["delay"]; ok {
						delay = dur(d)
					}
					var r Retry
					if r, err = sc.sub.Nack(m, p, off, delay, kv["reason"], sc.now); err == nil {
						if r.Dead {
							fmt.Fprintf(&b, "p%d@%d dead\n", p, off)
						} else {
							fmt.Fprintf(&b, "p%d@%d retry at=%s\n", p, off, sc.rel(r.At))
						}
					}
				default:
					err = sc.sub.Commit(m, p, off)
				}
				if err != nil {
					fmt.Fprintf(&b, "p%d@%d: %s\n", p, off, errs(err))
				}
			}
		}
		return b.String()
	case "tick":
		sc.now = sc.now.Add(dur(pos[0]))
		var b strings.Builder
		fmt.Fprintf(&b, "now %s\n", sc.rel(sc.now))
		for _, d := range sc.sub.Tick(sc.now) {
			dead := ""
			if d.Dead {
				dead = " dead"
			}
			fmt.Fprintf(&b, "expired %s%s\n", fmtDelivery(d), dead)
		}
		return b.String()
	case "deadletters":
		var b strings.Builder
		for _, d := range sc.sub.DeadLetters() {
			fmt.Fprintf(&b, "%sp%d@%d deliveries=%d reason=%q\n", viewPrefix(d.View), d.Partition, d.Offset, d.Deliveries, d.Reason)
		}
		if b.Len() == 0 {
			return "none"
		}
		return b.String()
	case "deadlettered":
		var b strings.Builder
		for _, a := range pos {
			p, off, _ := parseRef(t, a)
			if !sc.sub.DeadLettered("", p, off) {
				fmt.Fprintf(&b, "p%d@%d: not waiting\n", p, off)
			}
		}
		return b.String()
	case "restart":
		var b strings.Builder
		old := sc.sub
		ns, err := NewSub(old.Config(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range old.Views() {
			rec := old.Encode("g", "t", v)
			fmt.Fprintf(&b, "stored %s\n", fmtRecord(rec))
			if err := ns.Restore(rec); err != nil {
				t.Fatal(err)
			}
		}
		sc.sub = ns
		return b.String()
	case "state":
		return sc.fmtState()
	}
	t.Fatalf("unknown command %q", line)
	return ""
}

// parseRef parses O, P@O or P@O-O2.
func parseRef(t *testing.T, s string) (uint32, int64, int64) {
	p := 0
	if ps, rest, ok := strings.Cut(s, "@"); ok {
		p, _ = strconv.Atoi(ps)
		s = rest
	}
	los, his, ok := strings.Cut(s, "-")
	lo, err := strconv.ParseInt(los, 10, 64)
	if err != nil {
		t.Fatalf("bad offset %q", s)
	}
	hi := lo
	if ok {
		hi, _ = strconv.ParseInt(his, 10, 64)
	}
	return uint32(p), lo, hi
}

// feed offers the fake log to every view, as the actor would.
func (sc *scenario) feed() {
	for _, v := range sc.sub.Views() {
		for p := range sc.log {
			off, room := sc.sub.ReadFrom(v, uint32(p))
			if off < int64(len(sc.log[p])) {
				end := min(int64(len(sc.log[p])), off+int64(room))
				sc.sub.Append(v, sc.log[p][off:end]...)
			}
		}
	}
}

func fmtDelivery(d Delivery) string {
	s := fmt.Sprintf("%s p%d@%d #%d", d.Member, d.Partition, d.Offset, d.Count)
	if d.Key != "" {
		s += " key=" + d.Key
	}
	return s
}

func fmtPlan(pl Plan) string {
	var b strings.Builder
	for _, c := range pl {
		fmt.Fprintf(&b, "%s:", c.Member)
		if len(c.Revoke) > 0 {
			fmt.Fprintf(&b, " revoke %v", c.Revoke)
		}
		if len(c.Add) > 0 {
			fmt.Fprintf(&b, " add %v", c.Add)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (sc *scenario) fmtAssign() string {
	a := sc.sub.Assignor()
	var b strings.Builder
	for _, m := range a.Members() {
		fmt.Fprintf(&b, "%s: owns %v", m, a.Owned(m))
		if r := a.Revoking(m); len(r) > 0 {
			fmt.Fprintf(&b, " revoking %v", r)
		}
		if tg := a.Target(m); !slices.Equal(tg, a.Owned(m)) {
			fmt.Fprintf(&b, " target %v", tg)
		}
		b.WriteByte('\n')
	}
	var un []int
	for p := 0; p < a.Partitions(); p++ {
		if o, _ := a.Owner(uint32(p)); o == "" && !slices.ContainsFunc(a.Members(), func(m MemberID) bool {
			return slices.Contains(a.Revoking(m), uint32(p))
		}) {
			un = append(un, p)
		}
	}
	if len(un) > 0 {
		fmt.Fprintf(&b, "unowned %v\n", un)
	}
	return b.String()
}

func (sc *scenario) fmtState() string {
	s := sc.sub
	var b strings.Builder
	for _, m := range s.order {
		fmt.Fprintf(&b, "member %s credits=%d inflight=%d\n", m, s.Credits(m), s.InFlight(m))
	}
	for _, v := range s.Views() {
		name := "group"
		if v != "" {
			name = "view " + string(v)
		}
		fmt.Fprintf(&b, "%s:\n", name)
		w := s.views[v]
		for p, prog := range w.prog {
			fmt.Fprintf(&b, "  p%d %s next=%d pending=%d", p, prog, w.next[p], len(w.pending[p]))
			if lv := w.levels[p]; lv.hi > 0 {
				b.WriteString(" levels=")
				sep := ""
				for l := Priorities - 1; l >= 0; l-- {
					if lv.n[l] > 0 {
						fmt.Fprintf(&b, "%s%d:%d", sep, l, lv.n[l])
						sep = ","
					}
				}
			}
			if _, room := s.ReadFrom(v, uint32(p)); room == 0 {
				if w.next[p] >= prog.Limit() {
					b.WriteString(" paused(span)")
				} else {
					b.WriteString(" paused(pending)")
				}
			}
			b.WriteByte('\n')
		}
	}
	for _, f := range s.fl.sorted(func(*flight) bool { return true }) {
		fmt.Fprintf(&b, "inflight %s%s p%d@%d #%d due=%s\n", viewPrefix(f.id.view), f.member, f.id.part, f.id.off, f.count, sc.rel(f.deadline))
	}
	for _, r := range s.fl.retry {
		fmt.Fprintf(&b, "retry %sp%d@%d #%d at=%s", viewPrefix(r.id.view), r.id.part, r.id.off, r.count, sc.rel(r.notBefore))
		if r.avoid != "" {
			fmt.Fprintf(&b, " avoid=%s", r.avoid)
		}
		if r.reason != "" {
			fmt.Fprintf(&b, " reason=%q", r.reason)
		}
		if w := s.views[r.id.view]; r.id.off >= w.next[r.id.part] {
			b.WriteString(" unloaded")
		}
		b.WriteByte('\n')
	}
	for _, r := range s.fl.dead {
		fmt.Fprintf(&b, "dead %sp%d@%d #%d reason=%q", viewPrefix(r.id.view), r.id.part, r.id.off, r.count, r.reason)
		if w := s.views[r.id.view]; r.id.off >= w.next[r.id.part] {
			b.WriteString(" unloaded")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func viewPrefix(v MemberID) string {
	if v == "" {
		return ""
	}
	return "[" + string(v) + "] "
}

// fmtRecord renders a stored progress record stably (prototext output is
// deliberately unstable, so it cannot be used in golden files).
func fmtRecord(r *heraldpb.GroupProgress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "group=%s topic=%s", r.GetGroup(), r.GetTopic())
	if r.GetSubscriber() != "" {
		fmt.Fprintf(&b, " subscriber=%s", r.GetSubscriber())
	}
	for _, p := range r.GetPartitions() {
		fmt.Fprintf(&b, " p%d{floor=%d runs=%v", p.GetPartition(), p.GetAckFloor(), p.GetAckedRuns())
		for _, pr := range p.GetRetries() {
			fmt.Fprintf(&b, " retry=%d#%d", pr.GetOffset(), pr.GetDeliveries())
			if pr.GetNotBeforeMs() != 0 {
				fmt.Fprintf(&b, "@%s", time.UnixMilli(pr.GetNotBeforeMs()).UTC().Format("15:04:05.000"))
			}
			if pr.GetReason() != "" {
				fmt.Fprintf(&b, "(%s)", pr.GetReason())
			}
		}
		b.WriteByte('}')
	}
	return b.String()
}
