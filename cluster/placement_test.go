package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Placement properties over random clusters: replicas of a partition on
// distinct nodes and on as many racks as exist (up to rf); from no load,
// with racks unset or of equal size, replicas and leaders per node differ
// by at most one; the same input gives the same answer.
func TestPlaceProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	for round := 0; round < 500; round++ {
		n := 1 + r.IntN(9)
		rf := 1 + r.IntN(min(n, 5))
		parts := r.IntN(64)
		rackCount := 0
		if r.IntN(2) == 0 {
			rackCount = 1 + r.IntN(4)
		}
		var nodes []NodeInfo
		for i := 0; i < n; i++ {
			nd := NodeInfo{ID: uint64(10 + 3*i)}
			if rackCount > 0 {
				nd.Rack = fmt.Sprintf("r%d", i%rackCount)
			}
			nodes = append(nodes, nd)
		}
		r.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
		got, err := Place(parts, rf, nodes, nil)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		again, _ := Place(parts, rf, nodes, nil)
		if fmt.Sprint(got) != fmt.Sprint(again) {
			t.Fatalf("round %d: not deterministic", round)
		}
		rackOf := map[uint64]string{}
		racks := map[string]bool{}
		for _, nd := range nodes {
			rackOf[nd.ID] = nd.Rack
			racks[nd.Rack] = true
		}
		reps, leads := map[uint64]int{}, map[uint64]int{}
		for p, rs := range got {
			if len(rs) != rf {
				t.Fatalf("round %d partition %d: %d replicas, want %d", round, p, len(rs), rf)
			}
			seen, rk := map[uint64]bool{}, map[string]bool{}
			for _, id := range rs {
				if seen[id] || rackOf[id] == "" && rackCount > 0 {
					t.Fatalf("round %d partition %d: replicas %v", round, p, rs)
				}
				seen[id] = true
				rk[rackOf[id]] = true
				reps[id]++
			}
			if want := min(rf, len(racks)); len(rk) != want {
				t.Fatalf("round %d partition %d: replicas %v on %d racks, want %d", round, p, rs, len(rk), want)
			}
			leads[rs[0]]++
		}
		equalRacks := rackCount == 0 || n%rackCount == 0
		if parts > 0 && equalRacks {
			for name, m := range map[string]map[uint64]int{"replicas": reps, "leaders": leads} {
				lo, hi := parts*rf, 0
				for _, nd := range nodes {
					lo, hi = min(lo, m[nd.ID]), max(hi, m[nd.ID])
				}
				if hi-lo > 1 {
					t.Fatalf("round %d (%d nodes, %d racks, rf %d, %d partitions): %s per node from %d to %d", round, n, rackCount, rf, parts, name, lo, hi)
				}
			}
		}
	}
}

// Existing load steers new replicas and leaders to the lighter nodes.
func TestPlaceUsesLoad(t *testing.T) {
	nodes := []NodeInfo{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}
	load := map[uint64]Load{1: {Replicas: 6, Leaders: 3}, 2: {Replicas: 6, Leaders: 3}}
	got, err := Place(2, 2, nodes, load)
	if err != nil {
		t.Fatal(err)
	}
	for p, rs := range got {
		if slices.Contains(rs, 1) || slices.Contains(rs, 2) {
			t.Fatalf("partition %d on %v: the loaded nodes were chosen", p, rs)
		}
	}
	if got[0][0] == got[1][0] {
		t.Fatalf("both leaders on node %d", got[0][0])
	}
}

func TestPlaceErrors(t *testing.T) {
	if _, err := Place(1, 4, []NodeInfo{{ID: 1}, {ID: 2}, {ID: 3}}, nil); !errors.Is(err, ErrNotEnoughNodes) {
		t.Fatalf("rf 4 on 3 nodes: %v", err)
	}
	for _, nodes := range [][]NodeInfo{{{ID: 0}}, {{ID: 1}, {ID: 1}}} {
		if _, err := Place(1, 1, nodes, nil); err == nil {
			t.Fatalf("nodes %v accepted", nodes)
		}
	}
	if _, err := Place(1, 0, []NodeInfo{{ID: 1}}, nil); err == nil {
		t.Fatal("rf 0 accepted")
	}
}
