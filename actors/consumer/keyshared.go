package consumer

import (
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
)

// ringReplicas is the number of points each member has on the hash ring;
// with 64 the load of 2-16 members stays within about ±20% of even.
const ringReplicas = 64

// Ring chooses a member for a message key in key-shared mode by consistent
// hashing: a key maps to the first member point at or after its hash, so a
// join or leave moves only about 1/members of the keys. It is pure and
// deterministic (FNV-1a with a 64-bit finalizer; no random seed), so every
// coordinator replica and every restart maps keys the same way.
//
// Ring alone does not keep per-key order across membership changes: the
// subscription (Sub) keeps a key with the member that has messages of it in
// flight until they are acked, and consults the ring only for keys with
// nothing in flight.
type Ring struct {
	points []ringPoint // sorted by hash, then member
}

type ringPoint struct {
	hash   uint64
	member MemberID
}

func hashBytes(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	x := h.Sum64()
	// splitmix64 finalizer: FNV alone clusters similar short strings.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Add puts m on the ring; adding a member twice is a no-op.
func (r *Ring) Add(m MemberID) {
	if r.Has(m) {
		return
	}
	buf := make([]byte, 0, len(m)+8)
	for i := 0; i < ringReplicas; i++ {
		buf = append(append(buf[:0], m...), '#')
		buf = strconv.AppendInt(buf, int64(i), 10)
		r.points = append(r.points, ringPoint{hashBytes(buf), m})
	}
	sort.Slice(r.points, func(i, j int) bool {
		a, b := r.points[i], r.points[j]
		return a.hash < b.hash || a.hash == b.hash && a.member < b.member
	})
}

// Remove takes m off the ring.
func (r *Ring) Remove(m MemberID) {
	r.points = slices.DeleteFunc(r.points, func(p ringPoint) bool { return p.member == m })
}

// Has reports whether m is on the ring.
func (r *Ring) Has(m MemberID) bool {
	return slices.ContainsFunc(r.points, func(p ringPoint) bool { return p.member == m })
}

// Pick returns the member for key, or "" when the ring is empty.
func (r *Ring) Pick(key []byte) MemberID { return r.PickExcept(key, "") }

// PickExcept returns the member for key, skipping avoid unless it is the only
// member: the redelivery target after avoid timed out or nacked.
func (r *Ring) PickExcept(key []byte, avoid MemberID) MemberID {
	if len(r.points) == 0 {
		return ""
	}
	h := hashBytes(key)
	i := sort.Search(len(r.points), func(i int) bool { return r.points[i].hash >= h })
	for j := 0; j < len(r.points); j++ {
		p := r.points[(i+j)%len(r.points)]
		if p.member != avoid {
			return p.member
		}
	}
	return avoid
}
