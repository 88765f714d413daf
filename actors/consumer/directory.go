package consumer

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Directory is the node's lookup table of live subscriptions and request-
// reply responders, read by the Router on the network event loops without
// an actor hop. Coordinators write it. Safe for concurrent use.
type Directory struct {
	next       atomic.Uint64
	subs       sync.Map // subscription id -> subRef
	mu         sync.Mutex
	responders map[string]map[string]*Responders // topic -> coordinator id -> its responders
	snapshot   atomic.Pointer[map[string][]*Responders]
}

// Responders is one group's request-reply responders on a topic: its
// coordinator, and the lane through which the router pushes calls straight
// to a member's connection while that member has call budget.
type Responders struct {
	Coord *actor.PID
	lane  *lane
}

// lane holds the members the router may push calls to directly. Each has a
// budget of credits that the coordinator took from the member's
// subscription credits, so direct pushes never exceed what the member
// granted. The member list is copy-on-write.
type lane struct {
	members atomic.Pointer[[]*laneMember]
	rr      atomic.Uint32
}

type laneMember struct {
	member    MemberID
	subID     uint64
	conn      string // the netio session id
	budget    atomic.Int64
	refilling atomic.Bool // a refill request is on its way to the coordinator
}

// callBudget is the credits a responder member keeps for direct calls.
const callBudget = 64

// take picks a member with budget, round robin, and uses one unit of it.
func (l *lane) take() *laneMember {
	ms := l.members.Load()
	if ms == nil {
		return nil
	}
	n := len(*ms)
	start := int(l.rr.Add(1))
	for i := 0; i < n; i++ {
		m := (*ms)[(start+i)%n]
		for {
			b := m.budget.Load()
			if b <= 0 {
				break
			}
			if m.budget.CompareAndSwap(b, b-1) {
				return m
			}
		}
	}
	return nil
}

func (l *lane) set(fn func([]*laneMember) []*laneMember) {
	var cur []*laneMember
	if p := l.members.Load(); p != nil {
		cur = *p
	}
	next := fn(append([]*laneMember(nil), cur...))
	l.members.Store(&next)
}

type subRef struct {
	coord   *actor.PID
	session string // the netio session actor id that subscribed
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{responders: map[string]map[string]*Responders{}}
}

func (d *Directory) newSubID() uint64 { return d.next.Add(1) }

func (d *Directory) addSub(id uint64, coord *actor.PID, session string) {
	d.subs.Store(id, subRef{coord: coord, session: session})
}

func (d *Directory) removeSub(id uint64) { d.subs.Delete(id) }

// lookup finds the coordinator of subscription id, if session holds it.
func (d *Directory) lookup(id uint64, session string) (*actor.PID, bool) {
	v, ok := d.subs.Load(id)
	if !ok {
		return nil, false
	}
	r := v.(subRef)
	if r.session != session {
		return nil, false
	}
	return r.coord, true
}

func (d *Directory) setResponder(topic string, r *Responders, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	set := d.responders[topic]
	if on {
		if set == nil {
			set = map[string]*Responders{}
			d.responders[topic] = set
		}
		set[r.Coord.Id] = r
	} else if set != nil {
		delete(set, r.Coord.Id)
		if len(set) == 0 {
			delete(d.responders, topic)
		}
	}
	snap := make(map[string][]*Responders, len(d.responders))
	for t, s := range d.responders {
		for _, p := range s {
			snap[t] = append(snap[t], p)
		}
	}
	d.snapshot.Store(&snap)
}

// Responders lists the groups that answer calls to topic.
func (d *Directory) Responders(topic string) []*Responders {
	if m := d.snapshot.Load(); m != nil {
		return (*m)[topic]
	}
	return nil
}

// forgetCoordinator drops every entry of coord: it restarted or stopped, and
// its members' subscriptions are gone.
func (d *Directory) forgetCoordinator(coord *actor.PID) {
	d.subs.Range(func(k, v any) bool {
		if v.(subRef).coord.Equal(coord) {
			d.subs.Delete(k)
		}
		return true
	})
	d.mu.Lock()
	var gone []struct {
		topic string
		r     *Responders
	}
	for t, set := range d.responders {
		if r, ok := set[coord.Id]; ok {
			gone = append(gone, struct {
				topic string
				r     *Responders
			}{t, r})
		}
	}
	d.mu.Unlock()
	for _, g := range gone {
		d.setResponder(g.topic, g.r, false)
	}
}
