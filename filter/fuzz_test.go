package filter

import (
	"errors"
	"testing"
)

// FuzzParseSQL guarantees that ParseSQL never panics, that it rejects only
// with a *SyntaxError whose Pos lies within the expression (or at MaxLen for
// ErrTooLong), and that an accepted expression's String() parses again to a
// filter with the same String() that matches the same records — unless the
// normalized form grew past MaxLen, which is then reported as ErrTooLong.
// Seeds are in testdata/fuzz/FuzzParseSQL.
func FuzzParseSQL(f *testing.F) {
	for _, s := range []string{
		"region = 'eu' AND amount > 100",
		"NOT (a IN (1, 'x') OR b NOT BETWEEN -1.5e3 AND c) AND d IS NOT NULL",
		"`x-y` <> \"a\"\"b\" OR __key = 'k' OR TRUE = flag",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		flt, err := ParseSQL(expr)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("ParseSQL(%q) = %T %v, want *SyntaxError", expr, err, err)
			}
			if se.Pos < 0 || se.Pos > max(len(expr), MaxLen) || (se.Pos > len(expr) && !errors.Is(err, ErrTooLong)) {
				t.Fatalf("ParseSQL(%q): Pos %d outside the expression", expr, se.Pos)
			}
			_ = se.Caret(expr)
			return
		}
		norm := flt.String()
		again, err := ParseSQL(norm)
		if len(norm) > MaxLen {
			if !errors.Is(err, ErrTooLong) {
				t.Fatalf("normalized form is %d bytes but re-parsing gave %v", len(norm), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("ParseSQL(%q) accepted, normalized %q rejected: %v", expr, norm, err)
		}
		if again.String() != norm {
			t.Fatalf("String() not stable:\n in  %q\n 1st %q\n 2nd %q", expr, norm, again.String())
		}
		for _, r := range sampleRecords(flt.root) {
			if a, b := flt.root.eval(r), again.root.eval(r); a != b {
				t.Fatalf("%q and its normalized form %q disagree on %v: %v vs %v", expr, norm, r, a, b)
			}
		}
	})
}

// FuzzParseTags guarantees that ParseTags never panics, rejects only with an
// in-range *SyntaxError, and that String() parses to the same filter.
func FuzzParseTags(f *testing.F) {
	for _, s := range []string{"*", "a || b", " a ||b|| a ", "a | b", "a || || b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		flt, err := ParseTags(expr)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Pos < 0 || se.Pos > max(len(expr), MaxLen) {
				t.Fatalf("ParseTags(%q) = %v", expr, err)
			}
			return
		}
		again, err := ParseTags(flt.String())
		if err != nil || again.String() != flt.String() {
			t.Fatalf("ParseTags(%q).String() = %q re-parses to %v, %v", expr, flt.String(), again, err)
		}
	})
}

// sampleRecords gives records that exercise the headers n names: numbers,
// strings, booleans, empty and missing values.
func sampleRecords(n node) []rec {
	var names []string
	walkOperands(n, func(o *operand) {
		if o.kind == oHeader {
			names = append(names, o.name)
		}
	})
	pool := []string{"1", "eu", "", "-2.5", "true", "100", "x", "1e3"}
	var out []rec
	for k := range len(pool) + 1 {
		var r rec
		if k%3 != 0 {
			r.key = pool[k%len(pool)]
		}
		for i, name := range names {
			if (i+k)%4 == 3 {
				continue // missing
			}
			r.hdrs = append(r.hdrs, [2]string{name, pool[(i+k)%len(pool)]})
		}
		out = append(out, r)
	}
	return out
}

func walkOperands(n node, fn func(*operand)) {
	switch n := n.(type) {
	case *andNode:
		for _, k := range n.kids {
			walkOperands(k, fn)
		}
	case *orNode:
		for _, k := range n.kids {
			walkOperands(k, fn)
		}
	case *notNode:
		walkOperands(n.kid, fn)
	case *cmpNode:
		fn(&n.l)
		fn(&n.r)
	case *inNode:
		fn(&n.x)
		for i := range n.items {
			fn(&n.items[i])
		}
	case *betweenNode:
		fn(&n.x)
		fn(&n.lo)
		fn(&n.hi)
	case *nullNode:
		fn(&n.x)
	}
}
