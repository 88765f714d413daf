package fakebroker

// Consumer groups and request-reply for the fake broker.
//
// The fake runs every group like a shared subscription, whatever its mode:
// one cursor per partition for the whole group, offsets handed to whichever
// member has credits (redeliveries first), per-message acks advancing a
// contiguous floor. A member that leaves (unsubscribes or disconnects)
// gives its unacked messages back for redelivery. Clustering members are
// told they own every partition. Tag filters ("a || b", "*") are applied;
// SQL filters are accepted and ignored. That is enough to unit-test the
// client's credit, ack and reconnect handling; it is not the broker's
// group semantics.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// SubInfo describes one live subscription, for tests.
type SubInfo struct {
	ID        uint64
	Conn      int
	Group     string
	Request   *heraldpb.SubscribeRequest
	Granted   int64 // credits granted in total (subscribe, acks, nacks)
	Delivered int64 // messages pushed in total (each uses a credit)
	Credits   int64 // Granted - Delivered: what the broker may still push
	InFlight  int   // pushed and not acked or nacked
}

// AckLog records one AckRequest or NackRequest the fake answered.
type AckLog struct {
	Conn         int
	Subscription uint64
	Nack         bool
	DelayMs      uint32
	Partitions   []uint32
	Offsets      []int64
	Credits      uint32
}

type msgKey struct {
	part uint32
	off  int64
}

type redelivery struct {
	msgKey
	notBefore time.Time
}

type group struct {
	name    string
	topic   string
	req     *heraldpb.SubscribeRequest // of the first member: mode and filter
	started bool                       // cursors positioned
	next    []int64                    // per partition: next offset to hand out
	floor   []int64                    // per partition: every offset below is done
	done    map[msgKey]bool            // done above the floor
	counts  map[msgKey]uint32          // deliveries so far
	retry   []redelivery
	calls   []*heraldpb.DeliveredMessage
	rr      int
}

type fakeSub struct {
	id        uint64
	conn      int
	s         *session
	g         *group
	req       *heraldpb.SubscribeRequest
	granted   int64
	delivered int64
	inflight  map[msgKey]bool
}

func (sb *fakeSub) credits() int64 { return sb.granted - sb.delivered }

// AutoDeliver turns the fake's delivery engine on (the default) or off.
// Off, subscriptions are accepted and acked but nothing is pushed except
// what the test sends with Push.
func AutoDeliver(on bool) Opt { return func(b *Broker) { b.manual = !on } }

// Push writes f (normally with id 0: Delivery, AssignmentChange,
// ReplyDelivery) to connection conn as it is.
func (b *Broker) Push(conn int, f *heraldpb.Frame) error {
	b.mu.Lock()
	s := b.sessions[conn]
	b.mu.Unlock()
	if s == nil {
		return fmt.Errorf("fakebroker: no connection %d", conn)
	}
	s.write(f)
	return nil
}

// Subscriptions returns the live subscriptions in id order.
func (b *Broker) Subscriptions() []SubInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]SubInfo, 0, len(b.subs))
	for _, sb := range b.subs {
		out = append(out, SubInfo{ID: sb.id, Conn: sb.conn, Group: sb.g.name, Request: proto.Clone(sb.req).(*heraldpb.SubscribeRequest),
			Granted: sb.granted, Delivered: sb.delivered, Credits: sb.credits(), InFlight: len(sb.inflight)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// SubscribeRequests returns every SubscribeRequest accepted, in order.
func (b *Broker) SubscribeRequests() []*heraldpb.SubscribeRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.subReqs)
}

// Acks returns every AckRequest and NackRequest answered, in order.
func (b *Broker) Acks() []AckLog {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.ackLog)
}

// Acked returns the offsets of a partition the group has acked (not
// nacked), in order.
func (b *Broker) Acked(groupName string, part uint32) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.groups[groupName]
	if g == nil || int(part) >= len(g.floor) {
		return nil
	}
	var out []int64
	for off := int64(0); off < g.floor[part]; off++ {
		out = append(out, off)
	}
	for k := range g.done {
		if k.part == part {
			out = append(out, k.off)
		}
	}
	slices.Sort(out)
	return out
}

func ok(id uint64, body any) *heraldpb.Frame {
	f := &heraldpb.Frame{Id: id}
	switch b := body.(type) {
	case *heraldpb.SubscribeResponse:
		f.Body = &heraldpb.Frame_SubscribeResponse{SubscribeResponse: b}
	case *heraldpb.AckResponse:
		f.Body = &heraldpb.Frame_AckResponse{AckResponse: b}
	case *heraldpb.NackResponse:
		f.Body = &heraldpb.Frame_NackResponse{NackResponse: b}
	case *heraldpb.CommitResponse:
		f.Body = &heraldpb.Frame_CommitResponse{CommitResponse: b}
	case *heraldpb.UnsubscribeResponse:
		f.Body = &heraldpb.Frame_UnsubscribeResponse{UnsubscribeResponse: b}
	case *heraldpb.ListGroupsResponse:
		f.Body = &heraldpb.Frame_ListGroupsResponse{ListGroupsResponse: b}
	case *heraldpb.DescribeGroupResponse:
		f.Body = &heraldpb.Frame_DescribeGroupResponse{DescribeGroupResponse: b}
	case *heraldpb.ResetGroupResponse:
		f.Body = &heraldpb.Frame_ResetGroupResponse{ResetGroupResponse: b}
	case *heraldpb.CallResponse:
		f.Body = &heraldpb.Frame_CallResponse{CallResponse: b}
	case *heraldpb.ReplyResponse:
		f.Body = &heraldpb.Frame_ReplyResponse{ReplyResponse: b}
	default:
		panic(fmt.Sprintf("fakebroker: no frame body for %T", body))
	}
	return f
}

// handleGroups handles the consumer-group and request-reply requests; false
// for other bodies.
func (s *session) handleGroups(f *heraldpb.Frame) bool {
	b := s.b
	id := f.GetId()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch body := f.GetBody().(type) {
	case *heraldpb.Frame_Subscribe:
		b.subscribeLocked(s, id, body.Subscribe)
	case *heraldpb.Frame_Ack:
		r := body.Ack
		b.settleLocked(s, id, r.GetSubscriptionId(), r.GetPartitions(), r.GetOffsets(), r.GetCredits(), false, 0)
	case *heraldpb.Frame_Nack:
		r := body.Nack
		b.settleLocked(s, id, r.GetSubscriptionId(), r.GetPartitions(), r.GetOffsets(), r.GetCredits(), true, r.GetDelayMs())
	case *heraldpb.Frame_Commit:
		r := body.Commit
		sb := b.subs[r.GetSubscriptionId()]
		if sb == nil || sb.conn != s.id {
			s.reply(errFrame(id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "no subscription %d", r.GetSubscriptionId()))
			return true
		}
		g := sb.g
		if int(r.GetPartition()) >= len(g.floor) {
			s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "no partition %d", r.GetPartition()))
			return true
		}
		for off := g.floor[r.GetPartition()]; off < r.GetOffset(); off++ {
			g.done[msgKey{r.GetPartition(), off}] = true
		}
		g.advance(r.GetPartition())
		s.reply(ok(id, &heraldpb.CommitResponse{}))
	case *heraldpb.Frame_Unsubscribe:
		sb := b.subs[body.Unsubscribe.GetSubscriptionId()]
		if sb == nil || sb.conn != s.id {
			s.reply(errFrame(id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "no subscription %d", body.Unsubscribe.GetSubscriptionId()))
			return true
		}
		b.leaveLocked(sb)
		s.reply(ok(id, &heraldpb.UnsubscribeResponse{}))
		b.pumpLocked()
	case *heraldpb.Frame_ListGroups:
		resp := &heraldpb.ListGroupsResponse{}
		for _, name := range b.groupNamesLocked() {
			g := b.groups[name]
			resp.Groups = append(resp.Groups, &heraldpb.GroupSummary{Group: name, Topic: g.topic, Mode: g.req.GetMode(),
				Members: uint32(len(b.membersLocked(g))), Lag: b.lagLocked(g)})
		}
		s.reply(ok(id, resp))
	case *heraldpb.Frame_DescribeGroup:
		g := b.groups[body.DescribeGroup.GetGroup()]
		if g == nil {
			s.reply(errFrame(id, heraldpb.ErrorCode_GROUP_NOT_FOUND, "no group %q", body.DescribeGroup.GetGroup()))
			return true
		}
		s.reply(ok(id, &heraldpb.DescribeGroupResponse{Group: b.describeLocked(g)}))
	case *heraldpb.Frame_ResetGroup:
		b.resetLocked(s, id, body.ResetGroup)
	case *heraldpb.Frame_Call:
		b.callLocked(s, id, body.Call)
	case *heraldpb.Frame_Reply:
		r := body.Reply
		var to *session
		var n int
		if _, err := fmt.Sscanf(r.GetInbox(), "fake-inbox-%d", &n); err == nil {
			to = b.sessions[n]
		}
		if to == nil {
			s.reply(errFrame(id, heraldpb.ErrorCode_INBOX_NOT_FOUND, "no inbox %q", r.GetInbox()))
			return true
		}
		to.write(&heraldpb.Frame{Body: &heraldpb.Frame_ReplyDelivery{ReplyDelivery: &heraldpb.ReplyDelivery{
			CorrelationId: r.GetCorrelationId(), Record: r.GetRecord()}}})
		s.reply(ok(id, &heraldpb.ReplyResponse{}))
	default:
		return false
	}
	return true
}

func (b *Broker) groupNamesLocked() []string {
	names := make([]string, 0, len(b.groups))
	for n := range b.groups {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (b *Broker) membersLocked(g *group) []*fakeSub {
	var out []*fakeSub
	for _, sb := range b.subs {
		if sb.g == g {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (b *Broker) subscribeLocked(s *session, id uint64, req *heraldpb.SubscribeRequest) {
	t := b.topics[req.GetTopic()]
	if t == nil {
		s.reply(errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic()))
		return
	}
	if req.GetGroup() == "" {
		s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "group is required"))
		return
	}
	if req.GetFilterType() == heraldpb.FilterType_FILTER_TAG && strings.TrimSpace(req.GetFilter()) == "" {
		s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_FILTER, "empty tag filter"))
		return
	}
	g := b.groups[req.GetGroup()]
	if g != nil && len(b.membersLocked(g)) > 0 && (g.topic != req.GetTopic() || g.req.GetMode() != req.GetMode() ||
		g.req.GetFilterType() != req.GetFilterType() || g.req.GetFilter() != req.GetFilter()) {
		s.reply(errFrame(id, heraldpb.ErrorCode_GROUP_CONFLICT, "group %q has members with another topic, mode or filter", req.GetGroup()))
		return
	}
	if g == nil || len(b.membersLocked(g)) == 0 && g.topic != req.GetTopic() {
		g = &group{name: req.GetGroup(), topic: req.GetTopic(), done: map[msgKey]bool{}, counts: map[msgKey]uint32{}}
		b.groups[req.GetGroup()] = g
	}
	if len(b.membersLocked(g)) == 0 {
		g.req = proto.Clone(req).(*heraldpb.SubscribeRequest)
	}
	if !g.started {
		g.started = true
		g.next = make([]int64, len(t.parts))
		g.floor = make([]int64, len(t.parts))
		for i, p := range t.parts {
			g.next[i] = startOffset(p, req.GetStart())
			g.floor[i] = g.next[i]
		}
	}
	b.nextSub++
	sb := &fakeSub{id: b.nextSub, conn: s.id, s: s, g: g, req: proto.Clone(req).(*heraldpb.SubscribeRequest),
		granted: int64(req.GetCredits()), inflight: map[msgKey]bool{}}
	b.subs[sb.id] = sb
	b.subReqs = append(b.subReqs, sb.req)
	s.reply(ok(id, &heraldpb.SubscribeResponse{SubscriptionId: sb.id, MemberId: fmt.Sprintf("member-%d", sb.id), Partitions: uint32(len(t.parts))}))
	if req.GetMode() == heraldpb.SubscriptionMode_MODE_CLUSTERING {
		a := &heraldpb.AssignmentChange{SubscriptionId: sb.id}
		for i := range t.parts {
			a.Added = append(a.Added, uint32(i))
		}
		s.write(&heraldpb.Frame{Body: &heraldpb.Frame_Assignment{Assignment: a}})
	}
	b.pumpLocked()
}

// startOffset resolves a start position in partition p (nil = latest).
func startOffset(p *partition, sp *heraldpb.StartPosition) int64 {
	switch at := sp.GetAt().(type) {
	case *heraldpb.StartPosition_Earliest:
		return 0
	case *heraldpb.StartPosition_Offset:
		return min(max(at.Offset, 0), p.hw)
	case *heraldpb.StartPosition_TimestampMs:
		for _, sb := range p.batches {
			if sb.AppendTimeMs >= at.TimestampMs {
				return sb.BaseOffset
			}
		}
	}
	return p.hw
}

func (b *Broker) settleLocked(s *session, id, subID uint64, parts []uint32, offs []int64, credits uint32, nack bool, delayMs uint32) {
	sb := b.subs[subID]
	if sb == nil || sb.conn != s.id {
		s.reply(errFrame(id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "no subscription %d", subID))
		return
	}
	if len(parts) != len(offs) {
		s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "%d partitions, %d offsets", len(parts), len(offs)))
		return
	}
	b.ackLog = append(b.ackLog, AckLog{Conn: s.id, Subscription: subID, Nack: nack, DelayMs: delayMs,
		Partitions: slices.Clone(parts), Offsets: slices.Clone(offs), Credits: credits})
	g := sb.g
	for i, p := range parts {
		k := msgKey{p, offs[i]}
		if !sb.inflight[k] {
			continue // stale
		}
		delete(sb.inflight, k)
		if nack {
			g.retry = append(g.retry, redelivery{k, time.Now().Add(time.Duration(delayMs) * time.Millisecond)})
			if delayMs > 0 {
				time.AfterFunc(time.Duration(delayMs)*time.Millisecond, func() {
					b.mu.Lock()
					defer b.mu.Unlock()
					b.pumpLocked()
				})
			}
		} else if int(p) < len(g.floor) && k.off >= g.floor[p] {
			g.done[k] = true
			g.advance(p)
		}
	}
	sb.granted += int64(credits)
	if nack {
		s.reply(ok(id, &heraldpb.NackResponse{}))
	} else {
		s.reply(ok(id, &heraldpb.AckResponse{}))
	}
	b.pumpLocked()
}

func (g *group) advance(p uint32) {
	for g.done[msgKey{p, g.floor[p]}] {
		delete(g.done, msgKey{p, g.floor[p]})
		g.floor[p]++
	}
}

// leaveLocked ends a subscription and gives its unacked messages back.
func (b *Broker) leaveLocked(sb *fakeSub) {
	delete(b.subs, sb.id)
	for k := range sb.inflight {
		sb.g.retry = append(sb.g.retry, redelivery{msgKey: k})
	}
}

// dropConnLocked ends the subscriptions of a closed connection.
func (b *Broker) dropConnLocked(conn int) {
	for _, sb := range b.subs {
		if sb.conn == conn {
			b.leaveLocked(sb)
		}
	}
	b.pumpLocked()
}

// pumpLocked pushes to every subscription with credits what its group has:
// calls (responders), due redeliveries, then new records round-robin over
// the partitions.
func (b *Broker) pumpLocked() {
	if b.manual || b.closed {
		return
	}
	ids := make([]uint64, 0, len(b.subs))
	for id := range b.subs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	now := time.Now()
	for _, id := range ids {
		sb := b.subs[id]
		g := sb.g
		t := b.topics[g.topic]
		var out []*heraldpb.DeliveredMessage
		for sb.credits() > int64(len(out)) {
			if sb.req.GetResponder() && len(g.calls) > 0 {
				out = append(out, g.calls[0])
				g.calls = g.calls[1:]
				continue
			}
			k, found := g.take(now, t)
			if !found {
				break
			}
			p := t.parts[k.part]
			rec, appendMs := p.recs[k.off], p.appendMs[k.off]
			if !tagMatch(g.req, rec) {
				g.done[k] = true
				g.advance(k.part)
				continue
			}
			g.counts[k]++
			sb.inflight[k] = true
			out = append(out, &heraldpb.DeliveredMessage{Partition: k.part, Offset: k.off, DeliveryCount: g.counts[k],
				AppendTimeMs: appendMs, Record: rec})
			if sb.req.GetAutoAck() {
				delete(sb.inflight, k)
				g.done[k] = true
				g.advance(k.part)
			}
		}
		if len(out) == 0 {
			continue
		}
		sb.delivered += int64(len(out))
		sb.s.write(&heraldpb.Frame{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: sb.id, Messages: out}}})
	}
}

// take picks the group's next message: a due redelivery, else the next
// offset of the next partition with records.
func (g *group) take(now time.Time, t *topic) (msgKey, bool) {
	for i, r := range g.retry {
		if !r.notBefore.After(now) {
			g.retry = slices.Delete(g.retry, i, i+1)
			return r.msgKey, true
		}
	}
	if t == nil {
		return msgKey{}, false
	}
	for i := range t.parts {
		p := (g.rr + i) % len(t.parts)
		if p < len(g.next) && g.next[p] < t.parts[p].hw {
			g.rr = p + 1
			k := msgKey{uint32(p), g.next[p]}
			g.next[p]++
			return k, true
		}
	}
	return msgKey{}, false
}

func tagMatch(req *heraldpb.SubscribeRequest, r *heraldpb.Record) bool {
	if req.GetFilterType() != heraldpb.FilterType_FILTER_TAG {
		return true
	}
	for _, want := range strings.Split(req.GetFilter(), "||") {
		want = strings.TrimSpace(want)
		if want == "*" || slices.Contains(r.GetTags(), want) {
			return true
		}
	}
	return false
}

func (b *Broker) lagLocked(g *group) int64 {
	t := b.topics[g.topic]
	var lag int64
	for i := range g.floor {
		if t != nil && i < len(t.parts) {
			lag += t.parts[i].hw - g.floor[i]
		}
	}
	return lag
}

func (b *Broker) describeLocked(g *group) *heraldpb.GroupInfo {
	info := &heraldpb.GroupInfo{Group: g.name, Topic: g.topic, Mode: g.req.GetMode(), FilterType: g.req.GetFilterType(), Filter: g.req.GetFilter()}
	t := b.topics[g.topic]
	for _, sb := range b.membersLocked(g) {
		m := &heraldpb.MemberInfo{MemberId: fmt.Sprintf("member-%d", sb.id), Name: sb.req.GetMemberName(),
			Address: sb.s.nc.RemoteAddr().String(), InFlight: uint32(len(sb.inflight)), Credits: uint32(max(sb.credits(), 0)),
			Delivered: uint64(sb.delivered), Responder: sb.req.GetResponder()}
		if sb.req.GetMode() == heraldpb.SubscriptionMode_MODE_CLUSTERING && t != nil {
			for i := range t.parts {
				m.Partitions = append(m.Partitions, uint32(i))
			}
		}
		info.Members = append(info.Members, m)
		info.InFlight += m.InFlight
	}
	for _, n := range g.counts {
		if n > 1 {
			info.Redelivered += uint64(n - 1)
		}
	}
	for i := range g.floor {
		pl := &heraldpb.PartitionLag{Partition: uint32(i), AckFloor: g.floor[i]}
		for k := range g.done {
			if k.part == uint32(i) {
				pl.AckedAbove++
			}
		}
		if t != nil && i < len(t.parts) {
			pl.HighWatermark = t.parts[i].hw
		}
		pl.Lag = pl.HighWatermark - pl.AckFloor - int64(pl.AckedAbove)
		info.Partitions = append(info.Partitions, pl)
	}
	return info
}

func (b *Broker) resetLocked(s *session, id uint64, req *heraldpb.ResetGroupRequest) {
	g := b.groups[req.GetGroup()]
	if g == nil {
		s.reply(errFrame(id, heraldpb.ErrorCode_GROUP_NOT_FOUND, "no group %q", req.GetGroup()))
		return
	}
	if req.GetTo().GetAt() == nil {
		s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "reset needs a position"))
		return
	}
	members := b.membersLocked(g)
	if len(members) > 0 && !req.GetForce() {
		s.reply(errFrame(id, heraldpb.ErrorCode_GROUP_HAS_MEMBERS, "group %q has %d members", g.name, len(members)))
		return
	}
	for _, sb := range members {
		delete(b.subs, sb.id) // forced: their subscriptions end
	}
	t := b.topics[g.topic]
	for i := range g.floor {
		if len(req.GetPartitions()) > 0 && !slices.Contains(req.GetPartitions(), uint32(i)) {
			continue
		}
		off := startOffset(t.parts[i], req.GetTo())
		g.floor[i], g.next[i] = off, off
		for k := range g.done {
			if k.part == uint32(i) {
				delete(g.done, k)
			}
		}
	}
	g.retry = nil
	s.reply(ok(id, &heraldpb.ResetGroupResponse{Group: b.describeLocked(g)}))
}

func (b *Broker) callLocked(s *session, id uint64, req *heraldpb.CallRequest) {
	chosen := map[*group]bool{}
	for _, name := range b.groupNamesLocked() {
		g := b.groups[name]
		if g.topic != req.GetTopic() {
			continue
		}
		for _, sb := range b.membersLocked(g) {
			if sb.req.GetResponder() {
				chosen[g] = true
				break
			}
		}
	}
	if len(chosen) == 0 {
		s.reply(errFrame(id, heraldpb.ErrorCode_NO_RESPONDERS, "no responders on %q", req.GetTopic()))
		return
	}
	inbox := fmt.Sprintf("fake-inbox-%d", s.id)
	s.reply(ok(id, &heraldpb.CallResponse{Inbox: inbox, Responders: uint32(len(chosen))}))
	for g := range chosen {
		g.calls = append(g.calls, &heraldpb.DeliveredMessage{Offset: -1, DeliveryCount: 1, Record: req.GetRecord(),
			ReplyInbox: inbox, CorrelationId: req.GetCorrelationId()})
	}
	b.pumpLocked()
}
