package broker

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/topic"
	"github.com/heraldmq/herald/actors/txn"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// startTxn makes sure `__txn` exists and starts the transaction
// coordinator (on a single node; in a cluster coordinateInternal runs it
// on the leader of the replicated __txn).
func (b *Broker) startTxn(clustered bool, push txn.Pusher) error {
	b.txnProps = txn.Props(txn.Options{
		Topics: b.reg, Logger: b.log, Push: push, Now: b.clock.Now,
		CheckInterval: b.cfg.TxnCheckInterval, MaxChecks: uint32(b.cfg.TxnMaxChecks), MaxPending: b.cfg.MaxHalfPending,
		MaxDelay: b.cfg.MaxDelay, TxnTimeout: b.cfg.TxnTimeout, MaxTxnTimeout: b.cfg.MaxTxnTimeout,
		GroupOffsets: b.groupOffsets,
	})
	if clustered {
		return nil
	}
	res, err := b.sys.Root.RequestFuture(b.manager, &topic.EnsureInternal{Name: txn.Topic, Partitions: 1, MaxMessageBytes: b.scheduleMaxMessage()}, 30*time.Second).Result()
	if err == nil {
		err = res.(*topic.EnsureInternalResult).Err
	}
	if err != nil {
		return fmt.Errorf("internal topic %s: %w", txn.Topic, err)
	}
	if b.txn, err = b.sys.Root.SpawnNamed(b.txnProps, txn.ActorName); err != nil {
		return fmt.Errorf("transaction coordinator: %w", err)
	}
	return nil
}

// toTxn reports whether f is the transaction coordinator's: a half
// message or a transactional produce, an end of either, a producer
// registration or session, or a listing.
func toTxn(f *heraldpb.Frame) bool {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		// (A batch written once goes to its partition: txn_batch.)
		return b.Produce.GetHalf() != nil || b.Produce.GetTransactionalId() != "" && !b.Produce.GetTxnBatch()
	case *heraldpb.Frame_EndHalf, *heraldpb.Frame_RegisterProducer, *heraldpb.Frame_ListTxn, *heraldpb.Frame_InitProducerId, *heraldpb.Frame_EndTxn:
		return true
	}
	return false
}

// routeTxn hands f to the transaction coordinator: the local one on a
// single node or where it runs. Elsewhere in a cluster it answers
// NOT_COORDINATOR naming the node that runs it (the leader of __txn): the
// client goes there, since check-backs travel over its connection to the
// coordinator.
func (b *Broker) routeTxn(f *heraldpb.Frame, replyTo *actor.PID) {
	if b.member == nil || b.txnHere.Load() {
		b.sys.Root.RequestWithCustomSender(actor.NewPID(b.sys.Address(), txn.ActorName), f, replyTo)
		return
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "node %d does not coordinate transactions", b.nodeID)
	if leader := b.txnLeader.Load(); leader != 0 && leader != b.nodeID {
		e.Leader = uint32(leader)
		e.Message += fmt.Sprintf("; node %d does", leader)
	} else {
		e.Message += " (__txn is electing a leader)"
		e.RetryAfterMs = 200
	}
	b.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
}

// followTxn runs the transaction coordinator where __txn's leader is (in
// a cluster, from coordinateInternal). Called with groupsMu held.
func (b *Broker) followTxn(reg *registry.Registry) {
	leader, lead := b.leads(reg, txn.Topic)
	b.txnLeader.Store(leader)
	switch running := b.txn != nil; {
	case lead && !running:
		pid, err := b.sys.Root.SpawnNamed(b.txnProps, txn.ActorName)
		if err != nil {
			b.log.Error("starting the transaction coordinator", "err", err)
			return
		}
		b.txn = pid
		b.txnHere.Store(true)
		b.log.Info("coordinating transactions: this node leads __txn")
	case !lead && running:
		b.txnHere.Store(false)
		if _, err := b.sys.Root.StopFuture(b.txn).Result(); err != nil {
			b.log.Error("stopping the transaction coordinator", "err", err)
		}
		b.txn = nil
		b.log.Info("stopped coordinating transactions: this node no longer leads __txn", "leader", leader)
	}
}

// GroupsGroup is the name the groups manager of a cluster is reachable
// under through the cluster transport (on the node leading __groups).
const GroupsGroup = "herald-groups"

// groupOffsets hands a committed transaction's group offsets (a
// CommitTxnOffsets frame) to the groups manager: the local one on a single
// node or where it runs; else, in a cluster, the one on the node leading
// __groups. It blocks until the answer (the transaction coordinator calls
// it from a goroutine of its own).
func (b *Broker) groupOffsets(f *heraldpb.Frame) (*heraldpb.Frame, error) {
	if b.member == nil || b.groupsHere.Load() {
		res, err := b.sys.Root.RequestFuture(actor.NewPID(b.sys.Address(), consumer.ManagerName), f, 10*time.Second).Result()
		if err != nil {
			return nil, err
		}
		ans, ok := res.(*heraldpb.Frame)
		if !ok {
			return nil, fmt.Errorf("the groups manager answered %T", res)
		}
		return ans, nil
	}
	leader := b.groupsLeader.Load()
	if leader == 0 || leader == b.nodeID {
		e := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "no node coordinates consumer groups right now")
		return heraldpb.ErrorFrame(f.Id, e), nil
	}
	return b.member.Request(leader, GroupsGroup, f)
}
