package txn

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// An EndHalf that names a producer group ends only a half of that group:
// the broker's ACLs check produce on the group the request names, so the
// coordinator must not let it end another group's half.
func TestEndHalfOfAnotherGroupIsRefused(t *testing.T) {
	st := newState()
	st.halves[5] = &half{ref: 5, group: "payments", topic: "t"}
	id := FormatID(5)
	if _, e, _ := st.endTarget(&heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_COMMIT, ProducerGroup: "other"}); e == nil || e.Code != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("another group's EndHalf: %v, want TXN_NOT_FOUND", e)
	}
	for _, g := range []string{"payments", ""} {
		if h, e, _ := st.endTarget(&heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_COMMIT, ProducerGroup: g}); e != nil || h == nil {
			t.Fatalf("EndHalf naming group %q: %v %v", g, h, e)
		}
	}
}
