package exchange

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

func declare(t testing.TB, md Metadata, name string, typ heraldpb.ExchangeType, alternate string) {
	t.Helper()
	if _, err := md.Declare(&heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: name, Type: typ, Alternate: alternate}}); err != nil {
		t.Fatal(err)
	}
}

func bind(t testing.TB, md Metadata, b *heraldpb.Binding) {
	t.Helper()
	if _, err := md.Bind(b, false); err != nil {
		t.Fatal(err)
	}
}

func all(string) bool { return true }

func route(t testing.TB, tb *Table, ex, key string, hdr map[string]string) []string {
	t.Helper()
	var h Headers
	if hdr != nil {
		h = func(k string) ([]byte, bool) { v, ok := hdr[k]; return []byte(v), ok }
	}
	r, err := tb.Route(ex, key, h, all)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.Topics)
	return r.Topics
}

// naiveMatch is the reference: RabbitMQ's topic matching by recursion
// over the words (`*` one word, `#` zero or more).
func naiveMatch(pattern, key []string) bool {
	if len(pattern) == 0 {
		return len(key) == 0
	}
	switch pattern[0] {
	case "#":
		return naiveMatch(pattern[1:], key) || len(key) > 0 && naiveMatch(pattern, key[1:])
	case "*":
		return len(key) > 0 && naiveMatch(pattern[1:], key[1:])
	}
	return len(key) > 0 && key[0] == pattern[0] && naiveMatch(pattern[1:], key[1:])
}

func TestTopicPatterns(t *testing.T) {
	cases := []struct {
		pattern string
		match   []string
		miss    []string
	}{
		{"#", []string{"", "a", "a.b", "a..b", "."}, nil},
		{"#.#", []string{"", "a", "a.b.c"}, nil},
		{"a.#", []string{"a", "a.b", "a.b.c", "a."}, []string{"b", "", "b.a"}},
		{"#.a", []string{"a", "x.a", "x.y.a", ".a"}, []string{"a.x", ""}},
		{"a.#.b", []string{"a.b", "a.x.b", "a.x.y.b", "a..b"}, []string{"a.b.c", "a", "b", "x.a.b"}},
		{"*", []string{"a", ""}, []string{"a.b", "."}},
		{"a.*", []string{"a.b", "a."}, []string{"a", "a.b.c"}},
		{"*.*", []string{"a.b", ".", "a."}, []string{"a", "a.b.c"}},
		{"", []string{""}, []string{"a", "."}},
		{"a..b", []string{"a..b"}, []string{"a.b", "a.x.b"}},
		{"a.*.b", []string{"a..b", "a.x.b"}, []string{"a.b", "a.x.y.b"}},
		{"*.#", []string{"a", "a.b", ""}, nil},
		{"#.*", []string{"a", "a.b", ""}, nil},
		{"a.#.#.b", []string{"a.b", "a.x.y.z.b"}, []string{"a"}},
		{"a*", []string{"a*"}, []string{"ab", "a"}},
		{"stock.usd.nyse", []string{"stock.usd.nyse"}, []string{"stock.usd", "stock.usd.nyse.x"}},
	}
	for _, c := range cases {
		md := Metadata{}
		declare(t, md, "x", heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
		bind(t, md, &heraldpb.Binding{Exchange: "x", Topic: "t", Key: c.pattern})
		tb := Build(md)
		for _, k := range c.match {
			if got := route(t, tb, "x", k, nil); !slices.Equal(got, []string{"t"}) {
				t.Errorf("pattern %q, key %q: routed to %v, want t", c.pattern, k, got)
			}
			if !naiveMatch(strings.Split(c.pattern, "."), strings.Split(k, ".")) {
				t.Errorf("reference: pattern %q should match %q", c.pattern, k)
			}
		}
		for _, k := range c.miss {
			if got := route(t, tb, "x", k, nil); len(got) != 0 {
				t.Errorf("pattern %q, key %q: routed to %v, want nowhere", c.pattern, k, got)
			}
			if naiveMatch(strings.Split(c.pattern, "."), strings.Split(k, ".")) {
				t.Errorf("reference: pattern %q should not match %q", c.pattern, k)
			}
		}
		// The cached answer is the same.
		for _, k := range c.match {
			if got := route(t, tb, "x", k, nil); !slices.Equal(got, []string{"t"}) {
				t.Errorf("cached: pattern %q, key %q: routed to %v", c.pattern, k, got)
			}
		}
	}
}

func TestDirectFanoutHeaders(t *testing.T) {
	md := Metadata{}
	declare(t, md, "d", heraldpb.ExchangeType_EXCHANGE_DIRECT, "")
	declare(t, md, "f", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	declare(t, md, "h", heraldpb.ExchangeType_EXCHANGE_HEADERS, "")
	bind(t, md, &heraldpb.Binding{Exchange: "d", Topic: "red", Key: "red"})
	bind(t, md, &heraldpb.Binding{Exchange: "d", Topic: "warm", Key: "red"})
	bind(t, md, &heraldpb.Binding{Exchange: "d", Topic: "empty", Key: ""})
	bind(t, md, &heraldpb.Binding{Exchange: "f", Topic: "a"})
	bind(t, md, &heraldpb.Binding{Exchange: "f", Topic: "b", Key: "ignored"})
	bind(t, md, &heraldpb.Binding{Exchange: "h", Topic: "pdf-eu", Headers: map[string]string{"format": "pdf", "region": "eu"}})
	bind(t, md, &heraldpb.Binding{Exchange: "h", Topic: "pdf-or-eu", Headers: map[string]string{"format": "pdf", "region": "eu"}, MatchAny: true})
	bind(t, md, &heraldpb.Binding{Exchange: "h", Topic: "everything", Headers: nil})
	bind(t, md, &heraldpb.Binding{Exchange: "h", Topic: "nothing", Headers: nil, MatchAny: true})
	tb := Build(md)
	for _, c := range []struct {
		ex, key string
		hdr     map[string]string
		want    []string
	}{
		{"d", "red", nil, []string{"red", "warm"}},
		{"d", "Red", nil, nil},
		{"d", "", nil, []string{"empty"}},
		{"d", "blue", nil, nil},
		{"f", "anything", nil, []string{"a", "b"}},
		{"f", "", nil, []string{"a", "b"}},
		{"h", "", map[string]string{"format": "pdf", "region": "eu"}, []string{"everything", "pdf-eu", "pdf-or-eu"}},
		{"h", "", map[string]string{"format": "pdf", "region": "us"}, []string{"everything", "pdf-or-eu"}},
		{"h", "", map[string]string{"format": "pdf", "region": "eu", "x": "y"}, []string{"everything", "pdf-eu", "pdf-or-eu"}},
		{"h", "", map[string]string{"format": "PDF"}, []string{"everything"}},
		{"h", "", nil, []string{"everything"}},
		{"", "red", nil, []string{"red"}},
		{"", "", nil, nil},
	} {
		if got := route(t, tb, c.ex, c.key, c.hdr); !slices.Equal(got, c.want) {
			t.Errorf("%s %q %v: routed to %v, want %v", c.ex, c.key, c.hdr, got, c.want)
		}
	}
	if !tb.DependsOnHeaders("h") || tb.DependsOnHeaders("d") || tb.DependsOnHeaders("f") {
		t.Error("DependsOnHeaders is wrong")
	}
	if _, err := tb.Route("nope", "k", nil, all); err.GetCode() != heraldpb.ErrorCode_EXCHANGE_NOT_FOUND {
		t.Errorf("unknown exchange: %v", err)
	}
}

// TestChainsCyclesAndAlternates: exchange-to-exchange bindings are
// followed, a cycle ends with one copy per topic, and an exchange that
// routes nowhere hands the message to its alternate.
func TestChainsCyclesAndAlternates(t *testing.T) {
	md := Metadata{}
	declare(t, md, "unrouted", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	declare(t, md, "in", heraldpb.ExchangeType_EXCHANGE_TOPIC, "unrouted")
	declare(t, md, "eu", heraldpb.ExchangeType_EXCHANGE_DIRECT, "")
	declare(t, md, "loop", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	declare(t, md, "hx", heraldpb.ExchangeType_EXCHANGE_HEADERS, "")
	bind(t, md, &heraldpb.Binding{Exchange: "unrouted", Topic: "lost"})
	bind(t, md, &heraldpb.Binding{Exchange: "in", ToExchange: "eu", Key: "eu.#"})
	bind(t, md, &heraldpb.Binding{Exchange: "in", Topic: "all-orders", Key: "*.order"})
	bind(t, md, &heraldpb.Binding{Exchange: "eu", Topic: "eu-orders", Key: "eu.order"})
	bind(t, md, &heraldpb.Binding{Exchange: "eu", ToExchange: "loop", Key: "eu.order"})
	bind(t, md, &heraldpb.Binding{Exchange: "loop", ToExchange: "in"}) // a cycle: in -> eu -> loop -> in
	bind(t, md, &heraldpb.Binding{Exchange: "loop", Topic: "eu-orders"})
	bind(t, md, &heraldpb.Binding{Exchange: "loop", ToExchange: "hx"})
	bind(t, md, &heraldpb.Binding{Exchange: "hx", Topic: "flagged", Headers: map[string]string{"flag": "1"}})
	tb := Build(md)
	if got := route(t, tb, "in", "eu.order", nil); !slices.Equal(got, []string{"all-orders", "eu-orders"}) {
		t.Errorf("eu.order: %v", got)
	}
	if got := route(t, tb, "in", "eu.order", map[string]string{"flag": "1"}); !slices.Equal(got, []string{"all-orders", "eu-orders", "flagged"}) {
		t.Errorf("eu.order flagged: %v", got)
	}
	if got := route(t, tb, "in", "us.order", nil); !slices.Equal(got, []string{"all-orders"}) {
		t.Errorf("us.order: %v", got)
	}
	r, _ := tb.Route("in", "us.refund", nil, all)
	if !slices.Equal(r.Topics, []string{"lost"}) || !r.Alternate {
		t.Errorf("us.refund: %+v, want the alternate's topic", r)
	}
	// eu.refund matches eu.# into "eu", which routes nowhere: the
	// message is unroutable by "in", so the alternate gets it.
	r, _ = tb.Route("in", "eu.refund", nil, all)
	if !slices.Equal(r.Topics, []string{"lost"}) || !r.Alternate {
		t.Errorf("eu.refund: %+v", r)
	}
	if !tb.DependsOnHeaders("in") || !tb.DependsOnHeaders("loop") || tb.DependsOnHeaders("unrouted") {
		t.Error("DependsOnHeaders should follow bindings")
	}
	// A topic that does not exist routes nothing.
	r, _ = tb.Route("in", "us.order", nil, func(string) bool { return false })
	if !slices.Equal(r.Topics, nil) {
		t.Errorf("missing topics: %+v", r)
	}
}

func TestMetadataChanges(t *testing.T) {
	md := Metadata{}
	declare(t, md, "x", heraldpb.ExchangeType_EXCHANGE_DIRECT, "")
	if created, err := md.Declare(&heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: "x", Type: heraldpb.ExchangeType_EXCHANGE_DIRECT}}); created || err != nil {
		t.Errorf("redeclare: %v %v", created, err)
	}
	if _, err := md.Declare(&heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: "x", Type: heraldpb.ExchangeType_EXCHANGE_TOPIC}}); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Errorf("redeclare as another type: %v", err)
	}
	for _, bad := range []*heraldpb.ExchangeConfig{{Name: "", Type: 1}, {Name: "a b", Type: 1}, {Name: "x", Type: 9}, {Name: "y", Type: 1, Alternate: "no/pe"}} {
		if _, err := md.Declare(&heraldpb.ExchangeRecord{Config: bad}); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
			t.Errorf("declare %v: %v", bad, err)
		}
	}
	snapshot := md.Clone()
	tb := Build(snapshot)
	b := &heraldpb.Binding{Exchange: "x", Topic: "t", Key: "k"}
	next := md.Clone()
	if ch, err := next.Bind(b, false); !ch || err != nil {
		t.Fatalf("bind: %v %v", ch, err)
	}
	if ch, _ := next.Bind(&heraldpb.Binding{Exchange: "x", Topic: "t", Key: "k"}, false); ch {
		t.Error("binding twice changed something")
	}
	if len(snapshot["x"].Bindings) != 0 || len(route(t, tb, "x", "k", nil)) != 0 {
		t.Error("a change reached an earlier snapshot")
	}
	for _, bad := range []*heraldpb.Binding{{Exchange: "x"}, {Exchange: "x", Topic: "t", ToExchange: "y"}, {Exchange: "", Topic: "t"}, {Exchange: "x", Topic: "t", Key: strings.Repeat("k", 256)}} {
		if _, err := next.Bind(bad, false); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
			t.Errorf("bind %v: %v", bad, err)
		}
	}
	if _, err := next.Bind(&heraldpb.Binding{Exchange: "nope", Topic: "t"}, false); err.GetCode() != heraldpb.ErrorCode_EXCHANGE_NOT_FOUND {
		t.Errorf("bind from a missing exchange: %v", err)
	}
	if _, err := next.Bind(&heraldpb.Binding{Exchange: "x", ToExchange: "nope"}, false); err.GetCode() != heraldpb.ErrorCode_EXCHANGE_NOT_FOUND {
		t.Errorf("bind to a missing exchange: %v", err)
	}
	declare(t, next, "y", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	bind(t, next, &heraldpb.Binding{Exchange: "y", ToExchange: "x"})
	if err := next.Delete("x", true); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Errorf("delete if-unused with a binding: %v", err)
	}
	if err := next.Delete("x", false); err != nil {
		t.Fatal(err)
	}
	if len(next["y"].Bindings) != 0 {
		t.Errorf("the binding to a deleted exchange stayed: %v", next["y"].Bindings)
	}
	bind(t, next, &heraldpb.Binding{Exchange: "y", Topic: "gone"})
	next.DeleteTopic("gone")
	if len(next["y"].Bindings) != 0 {
		t.Error("the binding to a deleted topic stayed")
	}
	if ch, _ := next.Bind(&heraldpb.Binding{Exchange: "y", Topic: "gone"}, true); ch {
		t.Error("unbinding a missing binding changed something")
	}
}

// TestManyBindingsIndexed: 10,000 topic bindings; a key matches its
// three patterns, found through the trie.
func TestManyBindingsIndexed(t *testing.T) {
	md := Metadata{}
	declare(t, md, "x", heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
	for i := range 10_000 / 3 {
		bind(t, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-a", i), Key: fmt.Sprintf("region%d.*.created", i)})
		bind(t, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-b", i), Key: fmt.Sprintf("region%d.#", i)})
		bind(t, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-c", i), Key: fmt.Sprintf("*.shop%d.*", i)})
	}
	tb := Build(md)
	got := route(t, tb, "x", "region7.shop7.created", nil)
	if want := []string{"t7-a", "t7-b", "t7-c"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func BenchmarkRouteTopic10k(b *testing.B) {
	md := Metadata{}
	declare(b, md, "x", heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
	for i := range 10_000 / 3 {
		bind(b, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-a", i), Key: fmt.Sprintf("region%d.*.created", i)})
		bind(b, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-b", i), Key: fmt.Sprintf("region%d.#", i)})
		bind(b, md, &heraldpb.Binding{Exchange: "x", Topic: fmt.Sprintf("t%d-c", i), Key: fmt.Sprintf("*.shop%d.*", i)})
	}
	tb := Build(md)
	keys := make([]string, 8192) // more than the cache holds: misses too
	for i := range keys {
		keys[i] = fmt.Sprintf("region%d.shop%d.created", i%3333, i%3333)
	}
	b.ResetTimer()
	for i := range b.N {
		r, _ := tb.Route("x", keys[i%len(keys)], nil, all)
		if len(r.Topics) != 3 {
			b.Fatal(r.Topics)
		}
	}
}

// Deleting a vhost deletes its exchanges and the bindings to them,
// nothing of another vhost's or the default one's.
func TestDeleteVhost(t *testing.T) {
	md := Metadata{}
	declare(t, md, "A~x", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	declare(t, md, "AB~x", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	declare(t, md, "x", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	bind(t, md, &heraldpb.Binding{Exchange: "x", ToExchange: "A~x"})
	bind(t, md, &heraldpb.Binding{Exchange: "x", ToExchange: "AB~x"})
	before := md.Clone()
	md.DeleteVhost("A~")
	if md["A~x"] != nil || md["AB~x"] == nil || md["x"] == nil {
		t.Fatalf("after deleting A: %v", md)
	}
	if bs := md["x"].Bindings; len(bs) != 1 || bs[0].ToExchange != "AB~x" {
		t.Fatalf("bindings of x: %v", bs)
	}
	if len(before["x"].Bindings) != 2 {
		t.Fatal("the delete reached an earlier copy")
	}
}

// The caches of all of a table's topic exchanges hold at most
// TableCacheEntries keys together; past it keys are still routed.
func TestCachesBounded(t *testing.T) {
	md := Metadata{}
	for i := range 20 {
		name := fmt.Sprint("x", i)
		declare(t, md, name, heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
		bind(t, md, &heraldpb.Binding{Exchange: name, Topic: "t", Key: "#"})
	}
	tb := Build(md)
	for i := range 20 {
		for k := range CacheEntries {
			if got := route(t, tb, fmt.Sprint("x", i), fmt.Sprint("k.", k), nil); len(got) != 1 {
				t.Fatalf("x%d k.%d: %v", i, k, got)
			}
		}
	}
	n := 0
	for _, c := range tb.ex {
		n += len(c.cache.m)
		if len(c.cache.m) > CacheEntries {
			t.Fatalf("one cache holds %d", len(c.cache.m))
		}
	}
	if n > TableCacheEntries || tb.cached.Load() != int64(n) {
		t.Fatalf("%d keys cached (counted %d), at most %d", n, tb.cached.Load(), TableCacheEntries)
	}
}

// Bindings are bounded in bytes too: large header sets run into
// MaxBindingBytes (QUOTA_EXCEEDED) long before MaxBindings.
func TestBindingBytesBounded(t *testing.T) {
	md := Metadata{}
	declare(t, md, "h", heraldpb.ExchangeType_EXCHANGE_HEADERS, "")
	big := map[string]string{}
	for i := range MaxBindingHeaders {
		big[fmt.Sprintf("h%02d", i)] = strings.Repeat("v", MaxHeaderBytes-3)
	}
	n := 0
	for ; n < 1000; n++ {
		_, err := md.Bind(&heraldpb.Binding{Exchange: "h", Topic: fmt.Sprint("t", n), Headers: big}, false)
		if err != nil {
			if err.Code != heraldpb.ErrorCode_QUOTA_EXCEEDED {
				t.Fatal(err)
			}
			break
		}
	}
	if n == 1000 || md.bindingBytes() > MaxBindingBytes {
		t.Fatalf("%d bindings of %d bytes taken", n, md.bindingBytes())
	}
}
