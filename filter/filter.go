package filter

import (
	"strings"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Record is what a filter reads from a message. Implementations must not
// allocate in these methods if Match is to stay allocation-free, and must not
// be modified while Match runs. The returned slices are only read.
type Record interface {
	// Header returns the value of the first header called name.
	Header(name string) (value []byte, ok bool)
	// Tags returns the record's tags.
	Tags() []string
	// Key returns the record key; empty means none.
	Key() []byte
}

// Filter is a compiled subscription filter. It is immutable and safe for
// concurrent use. The nil *Filter matches every record.
type Filter struct {
	root   node                // SQL filter, or nil
	tags   []string            // tag filter, or nil
	tagSet map[string]struct{} // tags as a set, once there are many
	all    bool                // "*"
	norm   string
}

// tagSetMin is the tag count from which a map beats a linear scan.
const tagSetMin = 8

// ParseSQL compiles a SQL-92 style condition over headers (see the package
// doc for the grammar and semantics). It rejects a malformed expression, one
// longer than MaxLen or nested deeper than MaxDepth with a *SyntaxError.
func ParseSQL(expr string) (*Filter, error) {
	if len(expr) > MaxLen {
		return nil, tooLong(len(expr))
	}
	root, err := parseSQL(expr)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	root.format(&b)
	return &Filter{root: root, norm: b.String()}, nil
}

// ParseTags compiles a RocketMQ style tag filter: "tagA || tagB", or "*" (or
// blank) for every record. It rejects an empty tag, a single '|', a control
// character, a "*" among tags, or an expression longer than MaxLen with a
// *SyntaxError.
func ParseTags(expr string) (*Filter, error) {
	if len(expr) > MaxLen {
		return nil, tooLong(len(expr))
	}
	if t := strings.TrimSpace(expr); t == "" || t == "*" {
		return &Filter{all: true, norm: "*"}, nil
	}
	f := &Filter{}
	seen := map[string]bool{}
	for start := 0; start <= len(expr); {
		end := strings.Index(expr[start:], "||")
		if end < 0 {
			end = len(expr)
		} else {
			end += start
		}
		seg := expr[start:end]
		tag := strings.TrimSpace(seg)
		lead := strings.Index(seg, tag)
		switch {
		case tag == "":
			found := "end of expression"
			if end < len(expr) {
				found = "'||'"
			}
			return nil, errAt(end, "expected a tag but found %s", found)
		case tag == "*":
			return nil, errAt(start+lead, "'*' must be the whole expression")
		}
		for i := 0; i < len(tag); i++ {
			if c := tag[i]; c == '|' {
				return nil, errAt(start+lead+i, "unexpected '|'; separate tags with '||'")
			} else if c < 0x20 || c == 0x7f {
				return nil, errAt(start+lead+i, "unexpected byte %s in tag", quoteSnippet(tag[i:i+1]))
			}
		}
		if !seen[tag] {
			seen[tag] = true
			f.tags = append(f.tags, tag)
		}
		start = end + 2
	}
	if len(f.tags) >= tagSetMin {
		f.tagSet = make(map[string]struct{}, len(f.tags))
		for _, t := range f.tags {
			f.tagSet[t] = struct{}{}
		}
	}
	f.norm = strings.Join(f.tags, " || ")
	return f, nil
}

// Match reports whether r passes the filter: for a SQL filter, whether the
// condition is TRUE (not FALSE or UNKNOWN); for a tag filter, whether r has
// one of the tags.
func (f *Filter) Match(r Record) bool {
	switch {
	case f == nil || f.all:
		return true
	case f.root != nil:
		return f.root.eval(r) == tTrue3
	case f.tagSet != nil:
		for _, t := range r.Tags() {
			if _, ok := f.tagSet[t]; ok {
				return true
			}
		}
		return false
	}
	for _, t := range r.Tags() {
		for _, want := range f.tags {
			if t == want {
				return true
			}
		}
	}
	return false
}

// MatchesAll reports whether the filter lets every record through, so the
// caller can skip decoding headers.
func (f *Filter) MatchesAll() bool { return f == nil || f.all }

// String returns the normalized expression: keywords upper-case, one space
// around operators, "<>" for "!=", redundant parentheses dropped, names quoted
// only where needed, literals as written. Parsing it again with the same
// function gives an equivalent filter, provided it is within MaxLen (the
// normalized form can be a few bytes longer than the input, so store the
// expression as the subscriber wrote it, not this). The nil *Filter is "*".
func (f *Filter) String() string {
	if f == nil {
		return "*"
	}
	return f.norm
}

// FromProto adapts a decoded record without copying or allocating.
func FromProto(r *heraldpb.Record) Record { return protoRecord{r} }

type protoRecord struct{ r *heraldpb.Record }

func (p protoRecord) Header(name string) ([]byte, bool) {
	for _, h := range p.r.GetHeaders() {
		if h.GetKey() == name {
			return h.GetValue(), true
		}
	}
	return nil, false
}

func (p protoRecord) Tags() []string { return p.r.GetTags() }
func (p protoRecord) Key() []byte    { return p.r.GetKey() }
