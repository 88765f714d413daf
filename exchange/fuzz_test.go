package exchange

import (
	"slices"
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// words the fuzzer builds patterns and keys from: few, so that they meet.
var fuzzWords = []string{"a", "b", "", "*", "#", "ab"}

// split reads b as words: each byte picks a word, 0xff ends the list.
func split(b []byte) (words []string, rest []byte) {
	for i, c := range b {
		if c == 0xff {
			return words, b[i+1:]
		}
		words = append(words, fuzzWords[int(c)%len(fuzzWords)])
	}
	return words, nil
}

// FuzzTopicMatch compares the trie (and its cache) with the reference
// matcher: patterns and a key read from the input, each pattern bound to
// its own topic.
func FuzzTopicMatch(f *testing.F) {
	f.Add([]byte{4, 0xff, 0, 1})                         // # / a.b
	f.Add([]byte{0, 4, 1, 0xff, 0, 1, 0xff, 0, 2, 1})    // a.#.b / a.b / a..b
	f.Add([]byte{3, 3, 0xff, 4, 4, 0xff, 2})             // *.* / #.# / ""
	f.Add([]byte{4, 3, 4, 0xff, 0, 0xff, 0, 0, 0, 0, 0}) // #.*.# / a / a.a.a.a.a
	f.Fuzz(func(t *testing.T, data []byte) {
		var patterns [][]string
		rest := data
		for len(rest) > 0 && len(patterns) < 8 {
			var p []string
			p, rest = split(rest)
			patterns = append(patterns, p)
		}
		if len(patterns) < 2 {
			return
		}
		key := patterns[len(patterns)-1]
		patterns = patterns[:len(patterns)-1]
		keyText := strings.Join(key, ".")
		if strings.ContainsAny(keyText, "*#") || len(keyText) > MaxKeyBytes {
			return // a key's words are literal; the reference treats them as wildcards
		}
		md := Metadata{}
		declare(t, md, "x", heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
		var want []string
		for i, p := range patterns {
			pt := strings.Join(p, ".")
			if len(pt) > MaxKeyBytes {
				return
			}
			topic := "t" + string(rune('0'+i))
			bind(t, md, &heraldpb.Binding{Exchange: "x", Topic: topic, Key: pt})
			// strings.Split, as routing does: no words is one empty word.
			if naiveMatch(strings.Split(pt, "."), strings.Split(keyText, ".")) && !slices.Contains(want, topic) {
				want = append(want, topic)
			}
		}
		slices.Sort(want)
		tb := Build(md)
		for range 2 { // computed, then cached
			got := route(t, tb, "x", keyText, nil)
			if !slices.Equal(got, want) {
				t.Fatalf("patterns %q, key %q: trie %v, reference %v", patterns, keyText, got, want)
			}
		}
	})
}
