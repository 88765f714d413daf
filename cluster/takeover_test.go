package cluster

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

func TestTakeover(t *testing.T) {
	live := &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-old", ClusterAddress: "10.0.0.2:7501", HealthAddress: "10.0.0.2:7502"}
	view := View{Self: Member{NodeID: 1, MemberID: "m-1"}, Members: []Member{{NodeID: 1, MemberID: "m-1"}, {NodeID: 2, MemberID: "m-old"}}}
	cases := []struct {
		name string
		have *heraldpb.NodeRecord
		n    *heraldpb.NodeRecord
		v    View
		want bool
	}{
		{"first registration", nil, &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-new", ClusterAddress: "10.0.0.9:7501"}, view, false},
		{"restart at the same addresses", live, &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-new", ClusterAddress: live.ClusterAddress, HealthAddress: live.HealthAddress}, view, false},
		{"the same member again", live, &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-old", ClusterAddress: "10.0.0.9:7501"}, view, false},
		{"another process while the node lives", live, &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-new", ClusterAddress: "10.0.0.9:7501", HealthAddress: "10.0.0.9:7502"}, view, true},
		{"a node that moved after its old process died", live, &heraldpb.NodeRecord{NodeId: 2, MemberId: "m-new", ClusterAddress: "10.0.0.9:7501"},
			View{Self: view.Self, Members: view.Members[:1]}, false},
	}
	for _, c := range cases {
		if got := takeover(c.have, c.n, c.v); got != c.want {
			t.Errorf("%s: takeover %v, want %v", c.name, got, c.want)
		}
	}
}
