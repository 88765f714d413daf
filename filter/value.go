package filter

import (
	"bytes"
	"cmp"
	"strconv"
	"unsafe"
)

// num is a parsed number: an exact int64 when it has no fraction or exponent
// and fits, else a float64.
type num struct {
	isInt bool
	i     int64
	f     float64
}

func (n num) float() float64 {
	if n.isInt {
		return float64(n.i)
	}
	return n.f
}

func cmpNum(a, b num) int {
	if a.isInt && b.isInt {
		return cmp.Compare(a.i, b.i)
	}
	return cmp.Compare(a.float(), b.float())
}

// parseNum parses a whole header value as a number without allocating. It
// accepts the literal syntax plus a leading '+', and fails on anything else,
// including surrounding blanks and values out of float64 range.
func parseNum(b []byte) (num, bool) {
	if len(b) == 0 || len(b) > 64 {
		return num{}, false
	}
	// The bytes are not retained: strconv copies what it keeps in errors.
	s := unsafe.String(unsafe.SliceData(b), len(b))
	return parseNumString(s, true)
}

func parseNumString(s string, plus bool) (num, bool) {
	n, ok := scanNumber(s, plus)
	if !ok || n != len(s) {
		return num{}, false
	}
	if i, ok := parseInt(s); ok {
		return num{isInt: true, i: i}, true
	}
	// strconv's errors allocate, so it only sees well-formed input; what
	// remains is a range error.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // out of range; syntax was checked above
		return num{}, false
	}
	return num{f: f}, true
}

type operandKind uint8

const (
	oHeader operandKind = iota
	oKey                // the __key pseudo-field
	oString
	oNumber
	oBool
)

// operand is one side of a predicate, resolved at compile time as far as
// it can be.
type operand struct {
	kind operandKind
	name string // header name
	text []byte // string literal content, or number literal text as written
	n    num    // number literal
	b    bool   // boolean literal
	pos  int    // offset in the source, for errors
}

// stringy reports whether the operand forces a byte-wise comparison.
func (o *operand) stringy() bool { return o.kind == oString || o.kind == oBool }

// value is an operand's value for one record.
type value struct {
	text  []byte
	n     num
	numOK bool
	isB   bool
	b     bool
}

// resolve evaluates o against r. ok is false when o is NULL (missing header
// or empty key). The number is parsed only when wantNum is set.
func (o *operand) resolve(r Record, wantNum bool) (v value, ok bool) {
	switch o.kind {
	case oHeader:
		v.text, ok = r.Header(o.name)
		if !ok {
			return v, false
		}
	case oKey:
		v.text = r.Key()
		if len(v.text) == 0 {
			return v, false
		}
	case oString:
		v.text = o.text
		return v, true
	case oNumber:
		v.text, v.n, v.numOK = o.text, o.n, true
		return v, true
	case oBool:
		v.isB, v.b = true, o.b
		return v, true
	}
	if wantNum {
		v.n, v.numOK = parseNum(v.text)
	}
	return v, true
}

// compare orders a and b: numerically when numeric is set and both parsed as
// numbers, else byte-wise.
func compare(a, b *value, numeric bool) int {
	if numeric && a.numOK && b.numOK {
		return cmpNum(a.n, b.n)
	}
	return bytes.Compare(a.text, b.text)
}

// equal reports a = b, with the boolean rule: a boolean equals a value whose
// bytes are "true"/"false" (any ASCII case) of the same truth.
func equal(a, b *value, numeric bool) bool {
	switch {
	case a.isB && b.isB:
		return a.b == b.b
	case a.isB:
		return boolText(b.text, a.b)
	case b.isB:
		return boolText(a.text, b.b)
	}
	return compare(a, b, numeric) == 0
}

func boolText(t []byte, want bool) bool {
	if want {
		return len(t) == 4 && bytes.EqualFold(t, []byte("true"))
	}
	return len(t) == 5 && bytes.EqualFold(t, []byte("false"))
}

// parseInt parses s, already scanned as a number, as an int64; it fails on a
// fraction, an exponent or overflow.
func parseInt(s string) (int64, bool) {
	neg := false
	if s[0] == '-' || s[0] == '+' {
		neg = s[0] == '-'
		s = s[1:]
	}
	var u uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isDigit(c) {
			return 0, false
		}
		if u > (1<<63)/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
		if u > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(u), true // -(1<<63) wraps to itself: correct
	}
	if u == 1<<63 {
		return 0, false
	}
	return int64(u), true
}
