package consumer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// settle confirms every revoke in pl (and in the plans that follow) and
// returns how many partitions changed owner.
func settle(t *testing.T, a *Assignor, pl Plan) int {
	moved := 0
	for len(pl) > 0 {
		var next Plan
		for _, c := range pl {
			moved += len(c.Add)
			for _, p := range c.Revoke {
				more, err := a.Revoked(c.Member, p)
				if err != nil {
					t.Fatal(err)
				}
				next = append(next, more...)
			}
		}
		pl = next
	}
	return moved
}

func checkBalanced(t *testing.T, a *Assignor) {
	t.Helper()
	lo, hi := a.Partitions(), 0
	total := 0
	for _, m := range a.Members() {
		n := len(a.Owned(m))
		if !slices.Equal(a.Owned(m), a.Target(m)) {
			t.Fatalf("%s owns %v, target %v", m, a.Owned(m), a.Target(m))
		}
		lo, hi, total = min(lo, n), max(hi, n), total+n
	}
	if len(a.Members()) > 0 && (hi-lo > 1 || total != a.Partitions()) {
		t.Fatalf("unbalanced: lo %d hi %d total %d of %d", lo, hi, total, a.Partitions())
	}
}

func TestAssignorJoinMovesOnlyItsShare(t *testing.T) {
	for _, n := range []int{1, 3, 8, 12, 64} {
		a := NewAssignor(n)
		for k := 1; k <= 10; k++ {
			pl, err := a.Join(MemberID(fmt.Sprintf("m%d", k)))
			if err != nil {
				t.Fatal(err)
			}
			moved := settle(t, a, pl)
			checkBalanced(t, a)
			if want := (n + k - 1) / k; k > 1 && moved > want {
				t.Fatalf("n=%d join #%d moved %d partitions, want <= %d", n, k, moved, want)
			}
		}
	}
}

func TestAssignorRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for iter := 0; iter < 100; iter++ {
		a := NewAssignor(1 + r.IntN(20))
		var live []MemberID
		next := 0
		for step := 0; step < 60; step++ {
			var pl Plan
			var err error
			switch op := r.IntN(10); {
			case op < 4 || len(live) == 0:
				next++
				m := MemberID(fmt.Sprintf("m%d", next))
				live = append(live, m)
				pl, err = a.Join(m)
			case op < 6:
				i := r.IntN(len(live))
				pl, err = a.Remove(live[i])
				live = slices.Delete(live, i, i+1)
			case op < 7:
				pl = a.SetPartitions(1 + r.IntN(20))
			default:
				// Confirm one outstanding revoke, if its member is still there.
				for _, m := range live {
					if rv := a.Revoking(m); len(rv) > 0 {
						pl, err = a.Revoked(m, rv[0])
						break
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			// A partition is never added while another member owns it.
			for _, c := range pl {
				for _, p := range c.Add {
					if o, _ := a.Owner(p); o != c.Member && !slices.Contains(a.Revoking(c.Member), p) {
						t.Fatalf("added %d to %s but owner is %s", p, c.Member, o)
					}
				}
			}
		}
		for _, m := range live {
			for _, p := range a.Revoking(m) {
				pl, err := a.Revoked(m, p)
				if err != nil {
					t.Fatal(err)
				}
				settle(t, a, pl)
			}
		}
		checkBalanced(t, a)
	}
}

func TestAssignorDeterministic(t *testing.T) {
	run := func() string {
		a := NewAssignor(10)
		var out string
		for _, m := range []MemberID{"c", "a", "b"} {
			pl, _ := a.Join(m)
			out += fmt.Sprint(pl)
		}
		pl, _ := a.Remove("a")
		return out + fmt.Sprint(pl)
	}
	if x, y := run(), run(); x != y {
		t.Fatalf("%s != %s", x, y)
	}
}

func TestRingSpreadAndStability(t *testing.T) {
	var r Ring
	for i := 1; i <= 4; i++ {
		r.Add(MemberID(fmt.Sprintf("m%d", i)))
	}
	before := map[string]MemberID{}
	count := map[MemberID]int{}
	for i := 0; i < 10000; i++ {
		k := fmt.Sprintf("key-%d", i)
		before[k] = r.Pick([]byte(k))
		count[before[k]]++
	}
	for m, c := range count {
		if c < 1500 || c > 3500 {
			t.Errorf("%s got %d of 10000 keys", m, c)
		}
	}
	r.Add("m5")
	moved := 0
	for k, m := range before {
		if n := r.Pick([]byte(k)); n != m {
			if n != "m5" {
				t.Fatalf("key %s moved %s -> %s, not to the new member", k, m, n)
			}
			moved++
		}
	}
	if moved < 1000 || moved > 3000 {
		t.Errorf("join moved %d of 10000 keys", moved)
	}
	if got := r.PickExcept([]byte("key-1"), before["key-1"]); got == before["key-1"] || got == "" {
		t.Fatalf("PickExcept returned %q", got)
	}
}
