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
	responders map[string]map[string]*actor.PID // topic -> coordinator id -> pid
	snapshot   atomic.Pointer[map[string][]*actor.PID]
}

type subRef struct {
	coord   *actor.PID
	session string // the netio session actor id that subscribed
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{responders: map[string]map[string]*actor.PID{}}
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

func (d *Directory) setResponder(topic string, coord *actor.PID, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	set := d.responders[topic]
	if on {
		if set == nil {
			set = map[string]*actor.PID{}
			d.responders[topic] = set
		}
		set[coord.Id] = coord
	} else if set != nil {
		delete(set, coord.Id)
		if len(set) == 0 {
			delete(d.responders, topic)
		}
	}
	snap := make(map[string][]*actor.PID, len(d.responders))
	for t, s := range d.responders {
		for _, p := range s {
			snap[t] = append(snap[t], p)
		}
	}
	d.snapshot.Store(&snap)
}

// Responders lists the coordinators of the groups that answer calls to
// topic.
func (d *Directory) Responders(topic string) []*actor.PID {
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
	var topics []string
	for t, set := range d.responders {
		if _, ok := set[coord.Id]; ok {
			topics = append(topics, t)
		}
	}
	d.mu.Unlock()
	for _, t := range topics {
		d.setResponder(t, coord, false)
	}
}
