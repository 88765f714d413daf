package txn

import (
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// commitAlone writes s's transaction as one batch that commits it on t-0
// alone (commit_txn), and moves s to its next epoch if it did.
func (s *txnSession) commitAlone(vs ...string) *heraldpb.Frame {
	s.r.t.Helper()
	f := s.write(true, vs...)
	if f.GetProduceResponse() != nil {
		s.epoch, s.seq = s.epoch+1, 0
	}
	return f
}

// endFrom is s's EndTxn (commit, t-0 with its records) telling of the
// transactions committed alone from epoch from.
func (s *txnSession) endFrom(epoch, from uint32) *heraldpb.Frame {
	return s.r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: epoch, Commit: true,
		Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: uint32(s.seq)}}, OnePhaseFrom: &from}}}, s.r.txn)
}

// Transactions committed on their partition alone: the coordinator grants
// a session epochs and a lease to do so, hears of the ones done with the
// producer's next EndTxn (one_phase_from), which moves the id's epoch
// past them, and refuses one that claims another first epoch or too many.
// A new session's epoch is past every epoch the old one could commit
// alone, and its fence refuses the old one's commits.
func TestOnePhaseCommits(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	init := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "one", OnePhase: true}}}, r.txn).GetInitProducerIdResponse()
	if init.OnePhaseEpochs != onePhaseEpochs || init.OnePhaseLeaseMs != uint32(onePhaseLease.Milliseconds()) {
		t.Fatalf("InitProducerId granted %d epochs and %d ms", init.OnePhaseEpochs, init.OnePhaseLeaseMs)
	}
	if staged := r.session("staged"); staged == nil {
		t.Fatal("no session")
	}
	s := &txnSession{r: r, id: "one", pid: init.ProducerId, epoch: init.ProducerEpoch}
	first := s.epoch
	want := []string{"a", "b", "c"}
	for _, v := range want {
		if f := s.commitAlone(v); f.GetProduceResponse().GetBaseOffset() < 0 {
			t.Fatalf("commit alone of %s: %v", v, f)
		}
	}
	r.waitValues("the transactions committed alone", want)

	s.writeOnce("d")
	if f := s.endFrom(s.epoch, first+1); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("an EndTxn from the wrong epoch: %v", f)
	}
	if f := s.endFrom(first+onePhaseEpochs+maxPiped+1, first); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("an EndTxn too far past the coordinator's epoch: %v", f)
	}
	res := s.endFrom(s.epoch, first).GetEndTxnResponse()
	if res == nil || res.NextEpoch != s.epoch+1 || res.Records != 1 {
		t.Fatalf("the EndTxn after three commits alone: %v", res)
	}
	if again := s.endFrom(s.epoch, first).GetEndTxnResponse(); again == nil || again.NextEpoch != s.epoch+1 || !again.AlreadyEnded {
		t.Fatalf("the EndTxn again: %v", again)
	}
	s.epoch, s.seq = res.NextEpoch, 0
	want = append(want, "d")
	r.waitValues("d after them", want)
	// and on from there, as before
	if f := s.commitAlone("e"); f.GetProduceResponse() == nil {
		t.Fatalf("a commit alone after the EndTxn: %v", f)
	}
	want = append(want, "e")
	r.waitValues("e", want)

	// A new session: past every epoch the old one may commit alone.
	next := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "one", OnePhase: true}}}, r.txn).GetInitProducerIdResponse()
	if next.ProducerEpoch < res.NextEpoch+onePhaseEpochs+maxPiped {
		t.Fatalf("the new session's epoch %d is not past the old one's %d + %d", next.ProducerEpoch, res.NextEpoch, onePhaseEpochs+maxPiped)
	}
	zombie := *s
	zombie.epoch = res.NextEpoch + onePhaseEpochs - 1
	if f := zombie.commitAlone("zombie"); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the old session's commit alone: %v", f)
	}
	r.waitValues("nothing of the zombie", want)
}

// A new session whose fence cannot reach a partition waits for the old
// session's lease to commit alone to run out (half again as margin), not
// FenceWait alone; a session that said it would not commit alone is not
// waited for.
func TestOnePhaseLeaseHoldsANewSession(t *testing.T) {
	var failing atomic.Bool
	const lease = time.Second
	r := newRig(t, t.TempDir(), Options{FenceWait: 50 * time.Millisecond, onePhaseLease: lease,
		failSweep: func(req *heraldpb.ListOpenTxnsRequest) bool { return failing.Load() && req.FenceProducerId != 0 }})
	init := func(onePhase bool) time.Duration {
		t0 := time.Now()
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "held", OnePhase: onePhase}}}, r.txn)
		return time.Since(t0)
	}
	init(true)
	// (the coordinator just loaded: it counts a lease from then too)
	time.Sleep(lease + lease/2) // (time itself: the load's lease runs out, so that only the session's counts below)
	init(true)
	failing.Store(true)
	if took := init(false); took < lease {
		t.Fatalf("a new session started %v after the last one's InitProducerId, within its lease of %v", took, lease)
	}
	if took := init(true); took >= lease {
		t.Fatalf("a new session waited %v for one that would not commit alone", took)
	}
}
