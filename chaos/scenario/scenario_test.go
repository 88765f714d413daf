package scenario

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEmbeddedScenariosAreValid(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	var ci []string
	var ciTime time.Duration
	for _, s := range all {
		if s.CI {
			ci = append(ci, s.Name)
			ciTime += s.Duration.D() + s.Settle.D()
		}
		if plan := s.Plan(1); len(plan) == 0 {
			t.Errorf("%s: seed 1 plans no fault", s.Name)
		}
	}
	// Issue 16 §6: the CI subset includes at least these.
	for _, want := range []string{"leader-kill", "leader-pause", "minority-partition", "follower-bitflip", "disk-full", "clock-jump-delayed"} {
		if !slices.Contains(ci, want) {
			t.Errorf("scenario %s is not in the CI subset %v", want, ci)
		}
	}
	// About 10 minutes on 2 cores with the clusters' starts and the
	// checks (5m of budget ran in about 5m under -race: settling rarely
	// takes its whole budget).
	if ciTime > 6*time.Minute {
		t.Errorf("the CI subset runs %v of faults and settling, want at most 6m", ciTime)
	}
}

func TestParseRejectsEveryProblem(t *testing.T) {
	for _, c := range []struct {
		name, json string
		want       []string
	}{
		{"unknown field", `{"name":"x","colour":"red"}`, []string{"unknown field"}},
		{"bad duration", `{"name":"x","duration":"soon"}`, []string{"duration"}},
		{"everything wrong", `{"name":"a b","nodes":12,"workload":{"acks":"none","groups":[{"name":"g","mode":"fanout"}]},
			"nemesis":{"timeline":[{"at":"50s","kind":"explode","target":"node:15","for":"20s"},{"at":"1s","kind":"isolate"}]}}`,
			[]string{`name "a b"`, "nodes 12", "acks", "mode of", "does not fit", "unknown fault kind", "target", `needs "netns"`}},
		{"random without faults", `{"name":"x","nemesis":{"random":true}}`, []string{"random needs faults"}},
		{"clock jump without offset", `{"name":"x","nemesis":{"timeline":[{"at":"1s","kind":"clock-jump","for":"1s"}]}}`, []string{"needs an offset"}},
		{"fail without shared", `{"name":"x","workload":{"groups":[{"name":"g","mode":"clustering","fail":0.5}]}}`, []string{"fail needs shared"}},
	} {
		_, err := Parse([]byte(c.json))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Parse = %v, want ErrInvalid", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
}

func TestDefaults(t *testing.T) {
	s, err := Parse([]byte(`{"name":"x","workload":{"producers":1,"groups":[{"name":"g","mode":"shared"}]},
		"nemesis":{"timeline":[{"at":"1s","kind":"kill","for":"1s"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Nodes != 3 || s.Duration.D() != time.Minute || s.Topic.Name != "chaos" || s.Topic.Replication != 3 ||
		s.Workload.Acks != "all" || s.Workload.Groups[0].Members != 2 || s.Nemesis.Timeline[0].Target != "random" {
		t.Fatalf("defaults not filled: %+v", s)
	}
}

func TestRandomPlanIsReproducibleAndFits(t *testing.T) {
	s, err := Parse([]byte(`{"name":"x","duration":"100s","nemesis":{"random":true,"quiet":"3s","faults":[
		{"kind":"kill","for":"1s","for_max":"5s"},{"kind":"pause","target":"leader","for":"2s","for_max":"9s"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := s.Plan(7), s.Plan(7), s.Plan(8)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 7 planned twice differently:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 planned the same schedule %v", a)
	}
	end := time.Duration(0)
	for _, st := range a {
		if st.At.D() < end+3*time.Second {
			t.Errorf("step %+v starts before the quiet gap after %v", st, end)
		}
		if st.For.D() < time.Second || st.For.D() > 9*time.Second || st.ForMax != 0 {
			t.Errorf("step %+v lasts outside its fault's range", st)
		}
		end = st.At.D() + st.For.D()
	}
	if end > 100*time.Second || len(a) < 5 {
		t.Errorf("plan of %d steps ends at %v in a 100s run", len(a), end)
	}
}

func TestFind(t *testing.T) {
	if s, err := Find("leader-kill"); err != nil || s.Name != "leader-kill" {
		t.Fatalf("Find(leader-kill) = %v, %v", s, err)
	}
	if _, err := Find("leader-kil"); !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "leader-kill") {
		t.Fatalf("Find(leader-kil) = %v, want ErrUnknown listing the names", err)
	}
}
