package consumer

import (
	"fmt"
	"slices"
	"sort"
)

// MemberID names a member of a consumer group: one subscription of one
// client session. Members are compared and ordered by join order, never by
// name, except where a tie must be broken deterministically.
type MemberID string

// Change is what one member must do after a membership change: start
// consuming the partitions in Add, and stop consuming (pause, ack or give up
// in-flight work, then confirm with Assignor.Revoked) those in Revoke.
type Change struct {
	Member MemberID
	Add    []uint32
	Revoke []uint32
}

// Plan is the set of changes of one rebalance step, in member join order,
// listing only members with something to do. A nil Plan changes nothing.
type Plan []Change

// Assignor assigns a topic's partitions to the members of a clustering-mode
// group. It is pure and deterministic: the same calls in the same order give
// the same plans. The group coordinator owns it.
//
// The target assignment is balanced (member counts differ by at most one) and
// sticky: a rebalance keeps every partition whose owner is still alive and
// under its quota, and moves only the excess. The members that already hold
// more partitions keep the extra one when the count does not divide evenly.
//
// Moves are incremental and safe: a partition whose live owner must give it
// up is revoked first, stays paused (no new deliveries) while revoking, and is
// added to its new owner only after Revoked confirms it, or when the old owner
// leaves or dies. At no time do two members own one partition. Partitions
// without an owner, or whose owner is gone, are added at once.
type Assignor struct {
	members  []MemberID // join order
	owner    []MemberID // actual owner per partition; "" = none
	target   []MemberID // where the partition should be; "" = no members
	revoking []bool     // owner was asked to give it up
}

// NewAssignor returns an assignor for a topic with n partitions and no
// members.
func NewAssignor(n int) *Assignor {
	a := &Assignor{}
	a.resize(n)
	return a
}

func (a *Assignor) resize(n int) {
	a.owner = resizeSlice(a.owner, n)
	a.target = resizeSlice(a.target, n)
	a.revoking = resizeSlice(a.revoking, n)
}

func resizeSlice[T any](s []T, n int) []T {
	if n <= len(s) {
		return s[:n]
	}
	return append(s, make([]T, n-len(s))...)
}

// Members lists the members in join order.
func (a *Assignor) Members() []MemberID { return slices.Clone(a.members) }

// Partitions is the number of partitions assigned.
func (a *Assignor) Partitions() int { return len(a.owner) }

// Join adds m at the end of the join order and rebalances.
func (a *Assignor) Join(m MemberID) (Plan, error) {
	if slices.Contains(a.members, m) {
		return nil, fmt.Errorf("%w: %s", ErrMemberExists, m)
	}
	a.members = append(a.members, m)
	return a.rebalance(), nil
}

// Remove takes m out of the group, because it left or died: its partitions
// (and any it was revoking) are free at once, and the rest rebalance.
func (a *Assignor) Remove(m MemberID) (Plan, error) {
	i := slices.Index(a.members, m)
	if i < 0 {
		return nil, fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	a.members = slices.Delete(a.members, i, i+1)
	for p, o := range a.owner {
		if o == m {
			a.owner[p], a.revoking[p] = "", false
		}
		if a.target[p] == m {
			a.target[p] = ""
		}
	}
	return a.rebalance(), nil
}

// SetPartitions changes the partition count (a topic grew, or shrank on
// delete) and rebalances. Partitions at or above n are dropped without a
// revoke: they no longer exist.
func (a *Assignor) SetPartitions(n int) Plan {
	a.resize(n)
	return a.rebalance()
}

// Revoked confirms that m has stopped consuming p. p then goes to its target
// owner, which may be m again if a later rebalance moved it back.
func (a *Assignor) Revoked(m MemberID, p uint32) (Plan, error) {
	if int(p) >= len(a.owner) || a.owner[p] != m || !a.revoking[p] {
		return nil, fmt.Errorf("%w: %s partition %d", ErrNotRevoking, m, p)
	}
	a.owner[p], a.revoking[p] = "", false
	return a.plan(), nil
}

// Owner returns the member that may consume p now: the actual owner, unless
// it is revoking p (then p is paused). ok is false when nobody may.
func (a *Assignor) Owner(p uint32) (m MemberID, ok bool) {
	if int(p) >= len(a.owner) || a.revoking[p] {
		return "", false
	}
	return a.owner[p], a.owner[p] != ""
}

// Owned lists the partitions m owns now, revoking ones included, ascending.
func (a *Assignor) Owned(m MemberID) []uint32 { return a.collect(a.owner, m) }

// Revoking lists the partitions m has been asked to give up, ascending.
func (a *Assignor) Revoking(m MemberID) []uint32 {
	var ps []uint32
	for p, o := range a.owner {
		if o == m && a.revoking[p] {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// Target lists the partitions m will own once pending moves complete.
func (a *Assignor) Target(m MemberID) []uint32 { return a.collect(a.target, m) }

func (a *Assignor) collect(s []MemberID, m MemberID) []uint32 {
	var ps []uint32
	for p, o := range s {
		if o == m {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// rebalance recomputes the target from the previous one and returns the
// plan that moves ownership towards it.
func (a *Assignor) rebalance() Plan {
	n, k := len(a.target), len(a.members)
	if k == 0 {
		clear(a.target)
		return a.plan()
	}
	held := make(map[MemberID][]uint32, k)
	var free []uint32
	for p, t := range a.target {
		if t != "" && slices.Contains(a.members, t) {
			held[t] = append(held[t], uint32(p))
		} else {
			free = append(free, uint32(p))
		}
	}
	// Quotas: n/k each, and one more for the n%k members holding the most
	// (ties by join order), which keeps the most partitions where they are.
	order := slices.Clone(a.members)
	sort.SliceStable(order, func(i, j int) bool { return len(held[order[i]]) > len(held[order[j]]) })
	quota := make(map[MemberID]int, k)
	for i, m := range order {
		quota[m] = n / k
		if i < n%k {
			quota[m]++
		}
	}
	for _, m := range a.members {
		ps := held[m] // ascending: keep the lowest
		if len(ps) > quota[m] {
			free = append(free, ps[quota[m]:]...)
			held[m] = ps[:quota[m]]
		}
	}
	slices.Sort(free)
	for _, m := range a.members {
		for len(held[m]) < quota[m] {
			held[m] = append(held[m], free[0])
			free = free[1:]
		}
	}
	for m, ps := range held {
		for _, p := range ps {
			a.target[p] = m
		}
	}
	return a.plan()
}

// plan revokes partitions whose live owner is not their target, and adds
// unowned ones to their target.
func (a *Assignor) plan() Plan {
	adds := map[MemberID][]uint32{}
	revokes := map[MemberID][]uint32{}
	for p, t := range a.target {
		o := a.owner[p]
		switch {
		case o == t:
		case o == "":
			a.owner[p] = t
			adds[t] = append(adds[t], uint32(p))
		case !a.revoking[p]:
			a.revoking[p] = true
			revokes[o] = append(revokes[o], uint32(p))
		}
	}
	var pl Plan
	for _, m := range a.members {
		if adds[m] != nil || revokes[m] != nil {
			pl = append(pl, Change{Member: m, Add: adds[m], Revoke: revokes[m]})
		}
	}
	return pl
}
