package filter

import (
	"errors"
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// rec is a test record: headers as "name=value" pairs (first one wins).
type rec struct {
	hdrs [][2]string
	tags []string
	key  string
}

func (r rec) Header(name string) ([]byte, bool) {
	for _, h := range r.hdrs {
		if h[0] == name {
			return []byte(h[1]), true
		}
	}
	return nil, false
}
func (r rec) Tags() []string { return r.tags }
func (r rec) Key() []byte    { return []byte(r.key) }

// hdr builds a rec from "k=v" strings.
func hdr(kv ...string) rec {
	var r rec
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		r.hdrs = append(r.hdrs, [2]string{k, v})
	}
	return r
}

func TestSQLMatch(t *testing.T) {
	std := hdr("region=eu", "amount=150", "price=9.5", "n=-3", "flag=True", "s=abc",
		"empty=", "x-y=1", "and=kw", "__key=hk", "dup=first", "dup=second", "big=1e3", "zero=007", "plus=+5")
	std.key = "k1"
	none := rec{}
	cases := []struct {
		expr string
		r    rec
		want bool
	}{
		// comparisons, numeric
		{"amount = 150", std, true},
		{"amount = 150.0", std, true},
		{"amount <> 150", std, false},
		{"amount != 150", std, false},
		{"amount < 151", std, true},
		{"amount < 150", std, false},
		{"amount <= 150", std, true},
		{"amount > 100", std, true},
		{"amount > 1000", std, false},
		{"amount >= 150", std, true},
		{"amount >= 150.01", std, false},
		{"price > 9", std, true},
		{"price < 10", std, true},
		{"n < 0", std, true},
		{"n = -3", std, true},
		{"n > -3.5", std, true},
		{"big = 1000", std, true},
		{"zero = 7", std, true},
		{"plus = 5", std, true},
		{"1 < 2", none, true},
		{"2.5e1 = 25", none, true},
		{"amount > 99", std, true}, // numerically; byte-wise "150" < "99"
		// comparisons, strings
		{"region = 'eu'", std, true},
		{"region = 'EU'", std, false},
		{"region <> 'us'", std, true},
		{"region < 'ez'", std, true},
		{"region > 'ez'", std, false},
		{"amount = '150'", std, true},
		{"amount > '99'", std, false}, // string literal: byte-wise
		{"zero = '7'", std, false},
		{"empty = ''", std, true},
		{"s = 'it''s'", hdr("s=it's"), true},
		// numeric literal against a non-number: byte-wise with the literal text
		{"s > 100", std, true},
		{"s = 100", std, false},
		{"zero = 007", hdr("zero=x"), false},
		{"v = 007", hdr("v=007"), true},
		{"v > 5", hdr("v=5 "), true},         // "5 " is not a number; "5 " > "5"
		{"v = 1e308", hdr("v=1e999"), false}, // out of range: not a number
		{"v = 9223372036854775807", hdr("v=9223372036854775807"), true},
		{"v = -9223372036854775808", hdr("v=-9223372036854775808"), true},
		{"v > 9223372036854775807", hdr("v=10000000000000000000"), true}, // overflows to float
		{"v < 9223372036854775807", hdr("v=9223372036854775806"), true},  // exact as int64
		// header against header
		{"amount > price", std, true},
		{"region = s", std, false},
		{"a = b", hdr("a=10", "b=10.0"), true},
		{"a < b", hdr("a=9", "b=10"), true},
		{"a < b", hdr("a=9", "b=10x"), false},
		// booleans
		{"TRUE", none, true},
		{"FALSE", none, false},
		{"flag = TRUE", std, true},
		{"flag = true", std, true},
		{"flag <> FALSE", std, true},
		{"flag = FALSE", std, false},
		{"s = TRUE", std, false},
		{"s <> TRUE", std, true},
		{"TRUE = TRUE", none, true},
		{"TRUE <> FALSE", none, true},
		{"1 = TRUE", none, false},
		// AND / OR / NOT and precedence
		{"region = 'eu' AND amount > 100", std, true},
		{"region = 'eu' AND amount > 200", std, false},
		{"region = 'us' OR amount > 100", std, true},
		{"region = 'us' OR amount > 200", std, false},
		{"FALSE AND FALSE OR TRUE", none, true},   // (F AND F) OR T
		{"TRUE OR TRUE AND FALSE", none, true},    // T OR (T AND F)
		{"(TRUE OR TRUE) AND FALSE", none, false}, // parentheses
		{"NOT TRUE AND FALSE", none, false},       // (NOT T) AND F
		{"NOT FALSE AND TRUE", none, true},
		{"NOT (FALSE OR TRUE)", none, false},
		{"NOT FALSE OR FALSE", none, true},
		{"NOT NOT TRUE", none, true},
		{"NOT amount = 150", std, false}, // NOT binds looser than =
		{"not region = 'us' and amount between 100 and 200", std, true},
		{"((((region = 'eu'))))", std, true},
		// IN
		{"region IN ('eu', 'us')", std, true},
		{"region IN ('us', 'ap')", std, false},
		{"region NOT IN ('us', 'ap')", std, true},
		{"region NOT IN ('eu')", std, false},
		{"amount IN (1, 150.0, 'x')", std, true},
		{"amount IN ('150')", std, true},
		{"amount IN ('150.0')", std, false},
		{"zero IN (7)", std, true},
		{"s IN (1, 2)", std, false},
		{"'eu' IN ('eu')", none, true},
		{"'7' IN (7.0)", none, false}, // string literal: byte-wise
		// BETWEEN
		{"amount BETWEEN 100 AND 200", std, true},
		{"amount BETWEEN 150 AND 150", std, true},
		{"amount BETWEEN 151 AND 200", std, false},
		{"amount NOT BETWEEN 100 AND 200", std, false},
		{"amount NOT BETWEEN 151 AND 200", std, true},
		{"region BETWEEN 'a' AND 'f'", std, true},
		{"price BETWEEN n AND amount", std, true},
		{"amount BETWEEN 100 AND 200 AND region = 'eu'", std, true},
		// IS NULL
		{"missing IS NULL", std, true},
		{"missing IS NOT NULL", std, false},
		{"region IS NULL", std, false},
		{"region IS NOT NULL", std, true},
		{"empty IS NOT NULL", std, true}, // empty value is present
		{"'x' IS NULL", none, false},
		// quoted identifiers, reserved words, pseudo-fields, duplicates
		{`"x-y" = 1`, std, true},
		{"`x-y` = 1", std, true},
		{`"and" = 'kw'`, std, true},
		{`"__key" = 'hk'`, std, true},
		{"__key = 'k1'", std, true},
		{"__key IS NULL", none, true},
		{"__key IS NOT NULL", std, true},
		{"dup = 'first'", std, true},
		{"Region = 'eu'", std, false}, // header names are case-sensitive
		{`"a""b" = 1`, hdr(`a"b=1`), true},
		{"a.b_c = 1", hdr("a.b_c=1"), true},
		// whitespace
		{"\tregion='eu'\nAND\r\namount>100 ", std, true},
	}
	for _, c := range cases {
		f, err := ParseSQL(c.expr)
		if err != nil {
			t.Errorf("ParseSQL(%q): %v", c.expr, err)
			continue
		}
		if got := f.Match(c.r); got != c.want {
			t.Errorf("%q on %v = %v, want %v", c.expr, c.r.hdrs, got, c.want)
		}
	}
}

// TestThreeValued checks SQL's UNKNOWN for a missing header "m", alone and
// combined, against a record that has a=1.
func TestThreeValued(t *testing.T) {
	r := hdr("a=1")
	cases := []struct {
		expr string
		want tri
	}{
		{"m = 1", tUnknown},
		{"m <> 1", tUnknown},
		{"m < 1", tUnknown},
		{"m = 'x'", tUnknown},
		{"m = TRUE", tUnknown},
		{"NOT (m = 1)", tUnknown},
		{"NOT m = 1", tUnknown},
		{"m = m", tUnknown},
		{"a = m", tUnknown},
		{"m IN (1, 2)", tUnknown},
		{"m NOT IN (1, 2)", tUnknown},
		{"m BETWEEN 1 AND 2", tUnknown},
		{"m NOT BETWEEN 1 AND 2", tUnknown},
		{"a BETWEEN m AND 2", tUnknown},
		{"a BETWEEN 5 AND m", tFalse3}, // a >= 5 is FALSE
		{"a NOT BETWEEN 5 AND m", tTrue3},
		{"a BETWEEN m AND 0", tFalse3},
		{"m IS NULL", tTrue3},
		{"m IS NOT NULL", tFalse3},
		{"NOT m IS NULL", tFalse3},
		{"m = 1 AND a = 1", tUnknown},
		{"m = 1 AND a = 2", tFalse3},
		{"a = 2 AND m = 1", tFalse3},
		{"m = 1 OR a = 1", tTrue3},
		{"a = 1 OR m = 1", tTrue3},
		{"m = 1 OR a = 2", tUnknown},
		{"NOT (m = 1 OR a = 2)", tUnknown},
		{"NOT (m = 1 AND a = 2)", tTrue3},
		{"m = 1 OR TRUE", tTrue3},
		{"m = 1 AND FALSE", tFalse3},
		{"NOT NOT m = 1", tUnknown},
	}
	for _, c := range cases {
		f, err := ParseSQL(c.expr)
		if err != nil {
			t.Errorf("ParseSQL(%q): %v", c.expr, err)
			continue
		}
		if got := f.root.eval(r); got != c.want {
			t.Errorf("%q = %v, want %v", c.expr, got, c.want)
		}
		if f.Match(r) != (c.want == tTrue3) {
			t.Errorf("%q: Match = %v", c.expr, f.Match(r))
		}
	}
}

func TestSQLString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"a=1", "a = 1"},
		{"a!=1", "a <> 1"},
		{"a  <>  'x'", "a <> 'x'"},
		{"a = 'it''s'", "a = 'it''s'"},
		{"a=1 and b=2 or c=3", "a = 1 AND b = 2 OR c = 3"},
		{"a=1 and (b=2 or c=3)", "a = 1 AND (b = 2 OR c = 3)"},
		{"(a=1 and b=2) or c=3", "a = 1 AND b = 2 OR c = 3"},
		{"(a=1 or b=2) or (c=3 or d=4)", "a = 1 OR b = 2 OR c = 3 OR d = 4"},
		{"a=1 and (b=2 and c=3)", "a = 1 AND b = 2 AND c = 3"},
		{"not (a=1 and b=2)", "NOT (a = 1 AND b = 2)"},
		{"not (a=1)", "NOT a = 1"},
		{"not not a is null", "NOT NOT a IS NULL"},
		{"a not in (1,'x')", "a NOT IN (1, 'x')"},
		{"a not between -1.5 and 2e3", "a NOT BETWEEN -1.5 AND 2e3"},
		{"a is not null", "a IS NOT NULL"},
		{"true", "TRUE"},
		{`"x-y" = 007`, `"x-y" = 007`},
		{"`a\"b` = 1", "`a\"b` = 1"},
		{`"plain" = 1`, "plain = 1"},
		{`"and" = 1`, `"and" = 1`},
		{`"__key" = 1`, `"__key" = 1`},
		{"__key = 1", "__key = 1"},
		{`"1a" = 1`, `"1a" = 1`},
	}
	for _, c := range cases {
		f, err := ParseSQL(c.in)
		if err != nil {
			t.Errorf("ParseSQL(%q): %v", c.in, err)
			continue
		}
		if got := f.String(); got != c.want {
			t.Errorf("ParseSQL(%q).String() = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSQLErrors(t *testing.T) {
	cases := []struct {
		expr string
		pos  int
		msg  string // substring of Error()
	}{
		{"", 0, "expected a condition but found end of expression"},
		{"   ", 3, "expected a condition but found end of expression"},
		{"region = 'eu' AND (amount > 100", 31, "expected ')' but found end of expression"},
		{"(a = 1 AND b = 2 c", 17, "expected ')' but found 'c'"},
		{"a = 1 b", 6, "expected AND, OR or end of expression but found 'b'"},
		{"a = 1)", 5, "found ')'"},
		{"a", 1, "expected a comparison operator, IN, BETWEEN or IS but found end of expression"},
		{"a = ", 4, "expected a header name or a literal but found end of expression"},
		{"a = AND", 4, "found 'AND'"},
		{"a == 1", 2, "unexpected '=='"},
		{"a ! 1", 2, "unexpected '!'"},
		{"a = 'eu", 4, "unterminated string literal"},
		{`"a = 1`, 0, "unterminated quoted identifier"},
		{`"" = 1`, 0, "empty quoted identifier"},
		{"a = 1.", 4, "malformed number '1.'"},
		{"a = 1e", 4, "malformed number"},
		{"a = 12abc", 4, "malformed number '12abc'"},
		{"a = 1.2.3", 4, "malformed number"},
		{"a = 1e999", 4, "out of range"},
		{"a = #", 4, "unexpected character '#'"},
		{"a = é", 4, "unexpected character 'é'"},
		{"a = \x00", 4, `unexpected byte '\x00'`},
		{"a = - 1", 4, "unexpected character '-'"},
		{"a IN 1", 5, "expected '(' after IN but found '1'"},
		{"a IN ()", 6, "expected a string or number literal but found ')'"},
		{"a IN (b)", 6, "expected a string or number literal but found 'b'"},
		{"a IN (1, )", 9, "found ')'"},
		{"a IN (1 2)", 8, "expected ',' or ')' but found '2'"},
		{"a NOT LIKE 'x'", 6, "expected IN or BETWEEN after NOT but found 'LIKE'"},
		{"a BETWEEN 1 OR 2", 12, "expected AND of BETWEEN but found 'OR'"},
		{"a BETWEEN 1 AND", 15, "found end of expression"},
		{"a IS 1", 5, "expected NULL but found '1'"},
		{"a IS NOT", 8, "expected NULL but found end of expression"},
		{"a < TRUE", 2, "booleans compare only with '=' and '<>'"},
		{"a BETWEEN TRUE AND 1", 10, "BETWEEN does not take a boolean"},
		{"TRUE IN (1)", 0, "IN does not take a boolean"},
		{"__tag = 'x'", 0, "unknown pseudo-field '__tag'"},
		{"a = 1 AND", 9, "expected a condition but found end of expression"},
		{"NOT", 3, "expected a condition"},
		{"()", 1, "expected a condition but found ')'"},
		{"a = 1 OR OR b = 1", 9, "found 'OR'"},
		{"a = 'x' AND b = 'y'\nAND (c", 26, "found end of expression"},
		{"a = 'a-very-long-string-literal-indeed' x", 40, "found 'x'"},
		{"a = 1 'a-very-long-string-literal-indeed'", 6, `found ''a-very-long-string-lite...'`},
	}
	for _, c := range cases {
		_, err := ParseSQL(c.expr)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParseSQL(%q) = %v, want a *SyntaxError", c.expr, err)
			continue
		}
		if se.Pos != c.pos || !strings.Contains(se.Error(), c.msg) {
			t.Errorf("ParseSQL(%q) = %q (pos %d), want pos %d and %q", c.expr, se.Error(), se.Pos, c.pos, c.msg)
		}
		if errors.Is(err, ErrTooLong) || errors.Is(err, ErrTooDeep) {
			t.Errorf("ParseSQL(%q): a syntax error is marked as a limit: %v", c.expr, err)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	expr := "region = 'eu' AND (amount > 100 AND x"
	_, err := ParseSQL("a = 1 AND (b = 2 AND c = 3 OR")
	if err == nil {
		t.Fatal("accepted")
	}
	_, err = ParseSQL("(a = 1 AND b = 2 AND c = 3")
	if got, want := err.Error(), "filter: at 26: expected ')' but found end of expression"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	_, err = ParseSQL("(a = 1 and b = 2 and)")
	if got, want := err.Error(), "filter: at 20: expected a condition but found ')'"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	_, err = ParseSQL("(region = 'eu' amount > 1)")
	if got, want := err.Error(), "filter: at 15: expected ')' but found 'amount'"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}

	se := &SyntaxError{Pos: 19, Msg: "x"}
	if got, want := se.Caret(expr), expr+"\n"+strings.Repeat(" ", 19)+"^"; got != want {
		t.Errorf("Caret:\n%s\nwant\n%s", got, want)
	}
	// Multi-line: only the line holding Pos; tabs kept; runes counted.
	ml := "a = 1\n\tAND é = 'x' AND (\nOR b = 2"
	_, err = ParseSQL(ml)
	if !errors.As(err, &se) {
		t.Fatalf("ParseSQL(%q) = %v", ml, err)
	}
	if got, want := se.Caret(ml), "\tAND é = 'x' AND (\n\t    ^"; got != want {
		t.Errorf("Caret:\n%s\nwant\n%s", got, want)
	}
	if got, want := (&SyntaxError{Pos: 99}).Caret("ab"), "ab\n  ^"; got != want {
		t.Errorf("clamped Caret = %q, want %q", got, want)
	}
}

func TestLimits(t *testing.T) {
	// Longest accepted and shortest rejected.
	ok := "a = '" + strings.Repeat("x", MaxLen-6) + "'"
	if _, err := ParseSQL(ok); err != nil {
		t.Errorf("%d bytes: %v", len(ok), err)
	}
	_, err := ParseSQL(ok + " ")
	var se *SyntaxError
	if !errors.Is(err, ErrTooLong) || !errors.As(err, &se) || se.Pos != MaxLen {
		t.Errorf("%d bytes: %v, want ErrTooLong at %d", len(ok)+1, err, MaxLen)
	}
	if _, err := ParseTags(strings.Repeat("t||", MaxLen)); !errors.Is(err, ErrTooLong) {
		t.Errorf("long tags: %v, want ErrTooLong", err)
	}

	nest := func(n int) string { return strings.Repeat("(", n) + "a = 1" + strings.Repeat(")", n) }
	nots := func(n int) string { return strings.Repeat("NOT ", n) + "a = 1" }
	if _, err := ParseSQL(nest(MaxDepth)); err != nil {
		t.Errorf("depth %d: %v", MaxDepth, err)
	}
	if _, err := ParseSQL(nots(MaxDepth)); err != nil {
		t.Errorf("%d NOTs: %v", MaxDepth, err)
	}
	if _, err := ParseSQL(strings.Repeat("NOT (", MaxDepth/2) + "a = 1" + strings.Repeat(")", MaxDepth/2)); err != nil {
		t.Errorf("mixed depth %d: %v", MaxDepth, err)
	}
	for _, c := range []struct {
		expr string
		pos  int
	}{
		{nest(MaxDepth + 1), MaxDepth},
		{nots(MaxDepth + 1), 4 * MaxDepth},
		{strings.Repeat("(", 2000), MaxDepth},
		{"a = 1 AND " + strings.Repeat("NOT (", 40), 10 + 5*(MaxDepth/2)},
	} {
		_, err := ParseSQL(c.expr)
		if !errors.Is(err, ErrTooDeep) || !errors.As(err, &se) || se.Pos != c.pos {
			t.Errorf("ParseSQL(%.20q...) = %v, want ErrTooDeep at %d", c.expr, err, c.pos)
		}
	}

	// Long flat expressions are fine: AND/OR chains do not nest.
	var b strings.Builder
	b.WriteString("a = 1")
	for b.Len() < MaxLen-10 {
		b.WriteString(" OR a = 1")
	}
	f, err := ParseSQL(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if !f.Match(hdr("a=1")) {
		t.Error("long OR chain does not match")
	}
	if n := len(f.root.(*orNode).kids); n < 400 {
		t.Errorf("OR chain has %d kids", n)
	}
}

func TestTags(t *testing.T) {
	cases := []struct {
		expr string
		tags []string
		want bool
	}{
		{"*", nil, true},
		{"", []string{"a"}, true},
		{"  * ", nil, true},
		{"a", []string{"a"}, true},
		{"a", []string{"A"}, false},
		{"a", nil, false},
		{"a || b", []string{"x", "b"}, true},
		{"a||b", []string{"c"}, false},
		{" tag A || b ", []string{"tag A"}, true},
		{"t0||t1||t2||t3||t4||t5||t6||t7||t8||t9", []string{"x", "t9"}, true},
		{"t0||t1||t2||t3||t4||t5||t6||t7||t8||t9", []string{"t10"}, false},
	}
	for _, c := range cases {
		f, err := ParseTags(c.expr)
		if err != nil {
			t.Errorf("ParseTags(%q): %v", c.expr, err)
			continue
		}
		if got := f.Match(rec{tags: c.tags}); got != c.want {
			t.Errorf("ParseTags(%q).Match(%v) = %v, want %v", c.expr, c.tags, got, c.want)
		}
	}
	for in, want := range map[string]string{"*": "*", "": "*", " a ||b|| a ": "a || b"} {
		f, _ := ParseTags(in)
		if f.String() != want {
			t.Errorf("ParseTags(%q).String() = %q, want %q", in, f.String(), want)
		}
	}
	errs := []struct {
		expr string
		pos  int
		msg  string
	}{
		{"a ||", 4, "expected a tag but found end of expression"},
		{"|| a", 0, "expected a tag but found '||'"},
		{"a || || b", 5, "expected a tag but found '||'"},
		{"a | b", 2, "unexpected '|'; separate tags with '||'"},
		{"a ||| b", 4, "unexpected '|'"},
		{"a || *", 5, "'*' must be the whole expression"},
		{"a || b\x01", 6, `unexpected byte '\x01' in tag`},
	}
	for _, c := range errs {
		_, err := ParseTags(c.expr)
		var se *SyntaxError
		if !errors.As(err, &se) || se.Pos != c.pos || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("ParseTags(%q) = %v, want pos %d and %q", c.expr, err, c.pos, c.msg)
		}
	}
}

func TestNilAndAll(t *testing.T) {
	var f *Filter
	if !f.Match(rec{}) || !f.MatchesAll() || f.String() != "*" {
		t.Error("nil filter must match everything")
	}
	all, _ := ParseTags("*")
	if !all.MatchesAll() {
		t.Error("* must match all")
	}
	sql, _ := ParseSQL("TRUE")
	if sql.MatchesAll() {
		t.Error("MatchesAll is only for filters that need no evaluation")
	}
}

func TestFromProto(t *testing.T) {
	pr := &heraldpb.Record{
		Key:     []byte("k"),
		Headers: []*heraldpb.Header{{Key: "region", Value: []byte("eu")}, {Key: "region", Value: []byte("us")}, {Key: "amount", Value: []byte("150")}},
		Tags:    []string{"orders"},
	}
	r := FromProto(pr)
	for expr, want := range map[string]bool{
		"region = 'eu' AND amount > 100": true,
		"region = 'us'":                  false,
		"__key = 'k'":                    true,
		"missing IS NULL":                true,
	} {
		f, err := ParseSQL(expr)
		if err != nil {
			t.Fatal(err)
		}
		if f.Match(r) != want {
			t.Errorf("%q = %v, want %v", expr, !want, want)
		}
	}
	tf, _ := ParseTags("a || orders")
	if !tf.Match(r) {
		t.Error("tag filter misses")
	}
	if f, _ := ParseSQL("__key IS NULL"); !f.Match(FromProto(&heraldpb.Record{})) {
		t.Error("empty key must be NULL")
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	r := FromProto(benchRecord())
	for _, expr := range []string{
		"region = 'eu' AND amount > 100",
		"amount BETWEEN 1 AND 1000 OR region IN ('us', 'ap', 1)",
		"NOT (missing = 1) OR region IS NOT NULL",
		"s > 100 AND __key = 'order-42' AND flag = TRUE",
	} {
		f, err := ParseSQL(expr)
		if err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { f.Match(r) }); n != 0 {
			t.Errorf("%q: %v allocs per Match", expr, n)
		}
	}
}
