package raftwire

import (
	"reflect"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// raftMessageSeeds are messages of the kinds replicas send each other.
func raftMessageSeeds() []raftpb.Message {
	return []raftpb.Message{
		{},
		{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 3, Commit: 40},
		{Type: raftpb.MsgApp, To: 3, From: 1, Term: 7, LogTerm: 7, Index: 99, Commit: 98, Entries: []raftpb.Entry{
			{Term: 7, Index: 100, Type: raftpb.EntryNormal, Data: []byte("first batch")},
			{Term: 7, Index: 101, Type: raftpb.EntryNormal},
			{Term: 7, Index: 102, Type: raftpb.EntryConfChangeV2, Data: []byte{}},
		}},
		{Type: raftpb.MsgAppResp, To: 1, From: 2, Term: 7, Index: 50, Reject: true, RejectHint: 40, LogTerm: 6},
		{Type: raftpb.MsgSnap, To: 2, From: 1, Term: 9, Snapshot: &raftpb.Snapshot{Data: []byte("snap"),
			Metadata: raftpb.SnapshotMetadata{Index: 10, Term: 9, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}},
		{Type: raftpb.MsgVote, To: 1, From: 3, Term: 4, Context: []byte("campaign")},
		{Type: raftpb.MsgStorageAppend, Responses: []raftpb.Message{{Type: raftpb.MsgAppResp, To: 1, From: 2}},
			Entries: []raftpb.Entry{{Term: 1, Index: 1, Data: []byte{0}}}},
	}
}

func TestDecodeRaftMessageMatchesUnmarshal(t *testing.T) {
	for i, m := range raftMessageSeeds() {
		b, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var want raftpb.Message
		if err := want.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		got, err := decodeRaftMessage(b)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: decoded\n%+v\nUnmarshal gives\n%+v", i, got, want)
		}
	}
}

// TestDecodeRaftMessageAliases: the entries' data is not copied, and an
// append to it cannot overwrite the bytes after it.
func TestDecodeRaftMessageAliases(t *testing.T) {
	m := raftMessageSeeds()[2]
	b, _ := m.Marshal()
	got, err := decodeRaftMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Entries[0].Data
	d[0] = 'F'
	if got2, _ := decodeRaftMessage(b); string(got2.Entries[0].Data) != "First batch" {
		t.Fatalf("entry data is a copy: %q", got2.Entries[0].Data)
	}
	before := string(b)
	_ = append(d, "overwrite"...)
	if string(b) != before {
		t.Fatal("appending to entry data wrote into the message")
	}
}

// FuzzDecodeRaftMessage: on any bytes decodeRaftMessage never panics; what
// it accepts, raftpb.Message.Unmarshal accepts too and decodes the same;
// and whatever Unmarshal decodes, once marshalled again, it decodes the
// same as Unmarshal does.
func FuzzDecodeRaftMessage(f *testing.F) {
	for _, m := range raftMessageSeeds() {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want raftpb.Message
		wantErr := want.Unmarshal(b)
		got, err := decodeRaftMessage(b)
		if err == nil {
			if wantErr != nil {
				t.Fatalf("accepted what Unmarshal refuses (%v)", wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%+v\nUnmarshal gives\n%+v", got, want)
			}
		}
		if wantErr != nil {
			return
		}
		again, err := want.Marshal()
		if err != nil {
			return // Unmarshal keeps what Marshal cannot encode (an out-of-range enum is fine; this is not expected)
		}
		var want2 raftpb.Message
		if err := want2.Unmarshal(again); err != nil {
			t.Fatalf("Unmarshal refuses its own encoding: %v", err)
		}
		got2, err := decodeRaftMessage(again)
		if err != nil {
			t.Fatalf("refused a canonical encoding: %v", err)
		}
		if !reflect.DeepEqual(got2, want2) {
			t.Fatalf("canonical encoding decoded\n%+v\nUnmarshal gives\n%+v", got2, want2)
		}
	})
}
