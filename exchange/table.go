package exchange

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	heraldpb "github.com/heraldmq/herald/proto"
)

// CacheEntries bounds each topic exchange's cache of routing results by
// routing key; when full, an arbitrary entry makes room. TableCacheEntries
// bounds the entries of all of a table's caches together (keys of at most
// 255 bytes: a few tens of MiB at most); past it new keys are routed
// without being cached.
const (
	CacheEntries      = 4096
	TableCacheEntries = 65536
)

// Table is the compiled routing of a set of exchanges: immutable once
// built, safe for concurrent use (the network loops route with it). A
// change of the metadata builds a new Table, which starts with empty
// caches, so a cache never outlives the bindings it was computed from.
type Table struct {
	ex     map[string]*compiled
	cached atomic.Int64 // entries in all the caches
}

// target is where a binding sends: a topic, or another exchange.
type target struct {
	topic    string
	exchange string
}

type compiled struct {
	rec *heraldpb.ExchangeRecord
	// headersBelow: this exchange or one it reaches is a headers
	// exchange, so routing depends on each record's headers.
	headersBelow bool

	direct  map[string][]target
	fanout  []target
	trie    *trieNode
	headers []headerRule
	cache   *keyCache
}

type headerRule struct {
	want  map[string]string
	any   bool
	to    target
	empty bool // no headers: all matches every record, any none
}

// Build compiles md into a Table.
func Build(md Metadata) *Table {
	t := &Table{ex: make(map[string]*compiled, len(md))}
	for name, rec := range md {
		c := &compiled{rec: rec}
		for _, b := range rec.Bindings {
			to := target{topic: b.Topic, exchange: b.ToExchange}
			switch rec.Config.Type {
			case heraldpb.ExchangeType_EXCHANGE_DIRECT:
				if c.direct == nil {
					c.direct = map[string][]target{}
				}
				c.direct[b.Key] = append(c.direct[b.Key], to)
			case heraldpb.ExchangeType_EXCHANGE_TOPIC:
				if c.trie == nil {
					c.trie = &trieNode{}
					c.cache = &keyCache{m: map[string][]target{}, total: &t.cached}
				}
				c.trie.insert(strings.Split(b.Key, "."), to)
			case heraldpb.ExchangeType_EXCHANGE_FANOUT:
				c.fanout = append(c.fanout, to)
			case heraldpb.ExchangeType_EXCHANGE_HEADERS:
				c.headers = append(c.headers, headerRule{want: b.Headers, any: b.MatchAny, to: to, empty: len(b.Headers) == 0})
			}
		}
		t.ex[name] = c
	}
	// headersBelow: a fixed point over the exchange graph (cycles allowed).
	for changed := true; changed; {
		changed = false
		for _, c := range t.ex {
			if c.headersBelow {
				continue
			}
			below := c.rec.Config.Type == heraldpb.ExchangeType_EXCHANGE_HEADERS
			if a := t.ex[c.rec.Config.Alternate]; a != nil && a.headersBelow {
				below = true
			}
			for _, b := range c.rec.Bindings {
				if d := t.ex[b.ToExchange]; d != nil && d.headersBelow {
					below = true
				}
			}
			if below {
				c.headersBelow, changed = true, true
			}
		}
	}
	return t
}

// Exists reports whether the exchange is declared (the default exchange
// "" always is).
func (t *Table) Exists(name string) bool { return name == "" || t.ex[name] != nil }

// Record is a declared exchange's record, nil for none.
func (t *Table) Record(name string) *heraldpb.ExchangeRecord {
	if c := t.ex[name]; c != nil {
		return c.rec
	}
	return nil
}

// Records is the declared exchanges' records, sorted by name.
func (t *Table) Records() []*heraldpb.ExchangeRecord {
	md := make(Metadata, len(t.ex))
	for n, c := range t.ex {
		md[n] = c.rec
	}
	return md.List()
}

// DependsOnHeaders reports whether routing through the exchange reads
// the records' headers (a headers exchange is on its way): the caller
// then routes record by record, else once for the whole batch.
func (t *Table) DependsOnHeaders(name string) bool {
	c := t.ex[name]
	return c != nil && c.headersBelow
}

// Headers reads one of a record's headers.
type Headers func(name string) (value []byte, ok bool)

// Result is where a message goes.
type Result struct {
	// Topics to store a copy in, each once, in the order found.
	Topics []string
	// Alternate: the topics were found through an alternate exchange.
	Alternate bool
}

// Route is where a message published to exchange with key (and, for
// headers exchanges, hdr; nil for none) goes. exists reports whether a
// topic exists (a binding to a missing topic routes nothing). Bindings
// to other exchanges are followed; each exchange is visited at most once
// per message, so a cycle of bindings ends, and a topic reached twice gets
// one copy. An exchange that routes the message nowhere hands it to its
// alternate exchange. EXCHANGE_NOT_FOUND when exchange is not declared.
func (t *Table) Route(exchange, key string, hdr Headers, exists func(topic string) bool) (Result, *heraldpb.Error) {
	if exchange == "" {
		// The default exchange: every topic, bound under its own name.
		if key != "" && exists(key) {
			return Result{Topics: []string{key}}, nil
		}
		return Result{}, nil
	}
	c := t.ex[exchange]
	if c == nil {
		return Result{}, notFound(local(exchange))
	}
	r := router{t: t, key: key, hdr: hdr, exists: exists}
	r.route(c)
	return Result{Topics: r.topics, Alternate: r.alternate}, nil
}

type router struct {
	t         *Table
	key       string
	words     []string
	hdr       Headers
	exists    func(string) bool
	visited   []*compiled // few: a linear scan beats a map
	topics    []string
	alternate bool
}

func (r *router) seen(c *compiled) bool {
	for _, v := range r.visited {
		if v == c {
			return true
		}
	}
	r.visited = append(r.visited, c)
	return false
}

// route adds what c routes to, reporting whether it routed anywhere.
func (r *router) route(c *compiled) bool {
	if r.seen(c) {
		return false
	}
	found := false
	for _, to := range r.match(c) {
		if to.topic != "" {
			if r.exists(to.topic) {
				found = true
				if !slices.Contains(r.topics, to.topic) {
					r.topics = append(r.topics, to.topic)
				}
			}
			continue
		}
		if d := r.t.ex[to.exchange]; d != nil && r.route(d) {
			found = true
		}
	}
	if !found && c.rec.Config.Alternate != "" {
		if a := r.t.ex[c.rec.Config.Alternate]; a != nil && r.route(a) {
			r.alternate = true
			found = true
		}
	}
	return found
}

// match is the targets of c's bindings that the message matches.
func (r *router) match(c *compiled) []target {
	switch c.rec.Config.Type {
	case heraldpb.ExchangeType_EXCHANGE_DIRECT:
		return c.direct[r.key]
	case heraldpb.ExchangeType_EXCHANGE_FANOUT:
		return c.fanout
	case heraldpb.ExchangeType_EXCHANGE_TOPIC:
		if c.trie == nil {
			return nil
		}
		if hit, ok := c.cache.get(r.key); ok {
			return hit
		}
		if r.words == nil {
			r.words = strings.Split(r.key, ".")
		}
		out := c.trie.match(r.words)
		c.cache.put(r.key, out)
		return out
	case heraldpb.ExchangeType_EXCHANGE_HEADERS:
		var out []target
		for _, h := range c.headers {
			if h.matches(r.hdr) {
				out = append(out, h.to)
			}
		}
		return out
	}
	return nil
}

// matches applies RabbitMQ's x-match: all of the binding's headers equal
// the record's, or any one of them. A binding without headers matches
// every record with all, none with any.
func (h *headerRule) matches(hdr Headers) bool {
	if h.empty {
		return !h.any
	}
	if hdr == nil {
		return false
	}
	for k, v := range h.want {
		got, ok := hdr(k)
		eq := ok && string(got) == v
		if h.any && eq {
			return true
		}
		if !h.any && !eq {
			return false
		}
	}
	return !h.any
}

// keyCache holds a topic exchange's recent results by routing key.
type keyCache struct {
	mu    sync.Mutex
	m     map[string][]target
	total *atomic.Int64 // the table's count
}

func (k *keyCache) get(key string) ([]target, bool) {
	k.mu.Lock()
	v, ok := k.m[key]
	k.mu.Unlock()
	return v, ok
}

func (k *keyCache) put(key string, v []target) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch _, had := k.m[key]; {
	case had: // computed twice at once: the count stands
	case len(k.m) >= CacheEntries:
		for old := range k.m {
			delete(k.m, old)
			break
		}
	case k.total.Add(1) > TableCacheEntries:
		k.total.Add(-1)
		return // the table's caches are full: routed, not cached
	}
	k.m[key] = v
}

// trieNode indexes topic-exchange patterns word by word: a message's key
// is matched by walking the words, so the cost follows the key and the
// patterns that share its prefixes, never the number of bindings.
type trieNode struct {
	words   map[string]*trieNode
	star    *trieNode // `*`: exactly one word
	hash    *trieNode // `#`: zero or more words
	targets []target  // bindings whose pattern ends here
}

func (n *trieNode) insert(words []string, to target) {
	for _, w := range words {
		var next **trieNode
		switch w {
		case "*":
			next = &n.star
		case "#":
			next = &n.hash
		default:
			if n.words == nil {
				n.words = map[string]*trieNode{}
			}
			c := n.words[w]
			if c == nil {
				c = &trieNode{}
				n.words[w] = c
			}
			n = c
			continue
		}
		if *next == nil {
			*next = &trieNode{}
		}
		n = *next
	}
	n.targets = append(n.targets, to)
}

// match is the targets of the patterns that match words, each once.
func (n *trieNode) match(words []string) []target {
	m := trieMatch{words: words}
	m.visit(n, 0)
	return m.out
}

type trieMatch struct {
	words []string
	out   []target
	// hashSeen holds the (`#` node, position) pairs already expanded, so
	// patterns with several `#` cost nodes x words, not an exponential.
	hashSeen map[hashState]bool
	ends     map[*trieNode]bool
}

type hashState struct {
	n *trieNode
	i int
}

// visit continues the match at n with words[:i] consumed.
func (m *trieMatch) visit(n *trieNode, i int) {
	if n.hash != nil {
		m.absorb(n.hash, i)
	}
	if i == len(m.words) {
		m.end(n)
		return
	}
	if c := n.words[m.words[i]]; c != nil {
		m.visit(c, i+1)
	}
	if n.star != nil {
		m.visit(n.star, i+1)
	}
}

// absorb lets the `#` that leads to h take words[i:j], for every j.
func (m *trieMatch) absorb(h *trieNode, i int) {
	if m.hashSeen == nil {
		m.hashSeen = map[hashState]bool{}
	}
	for j := i; j <= len(m.words); j++ {
		s := hashState{h, j}
		if m.hashSeen[s] {
			break // an earlier expansion went on from j to the end
		}
		m.hashSeen[s] = true
		m.visit(h, j)
	}
}

func (m *trieMatch) end(n *trieNode) {
	if len(n.targets) == 0 {
		return
	}
	if m.ends == nil {
		m.ends = map[*trieNode]bool{}
	}
	if m.ends[n] {
		return
	}
	m.ends[n] = true
	m.out = append(m.out, n.targets...)
}
