package filter

import (
	"strings"
)

// tri is SQL's three-valued truth.
type tri uint8

const (
	tFalse3 tri = iota
	tTrue3
	tUnknown
)

func not3(t tri) tri {
	switch t {
	case tTrue3:
		return tFalse3
	case tFalse3:
		return tTrue3
	}
	return tUnknown
}

func of(b bool) tri {
	if b {
		return tTrue3
	}
	return tFalse3
}

// node is a compiled condition. eval does not allocate and recurses only
// through AND, OR and NOT, whose nesting the parser bounds by MaxDepth.
type node interface {
	eval(r Record) tri
	// format writes the normalized form.
	format(b *strings.Builder)
}

type andNode struct{ kids []node }
type orNode struct{ kids []node }
type notNode struct{ kid node }
type constNode struct{ v bool }

func (n *andNode) eval(r Record) tri {
	res := tTrue3
	for _, k := range n.kids {
		switch k.eval(r) {
		case tFalse3:
			return tFalse3
		case tUnknown:
			res = tUnknown
		}
	}
	return res
}

func (n *orNode) eval(r Record) tri {
	res := tFalse3
	for _, k := range n.kids {
		switch k.eval(r) {
		case tTrue3:
			return tTrue3
		case tUnknown:
			res = tUnknown
		}
	}
	return res
}

func (n *notNode) eval(r Record) tri           { return not3(n.kid.eval(r)) }
func (n *constNode) eval(Record) tri           { return of(n.v) }
func (n *constNode) format(b *strings.Builder) { writeBool(b, n.v) }

func (n *andNode) format(b *strings.Builder) {
	for i, k := range n.kids {
		if i > 0 {
			b.WriteString(" AND ")
		}
		if _, ok := k.(*orNode); ok {
			b.WriteByte('(')
			k.format(b)
			b.WriteByte(')')
		} else {
			k.format(b)
		}
	}
}

func (n *orNode) format(b *strings.Builder) {
	for i, k := range n.kids {
		if i > 0 {
			b.WriteString(" OR ")
		}
		k.format(b)
	}
}

func (n *notNode) format(b *strings.Builder) {
	b.WriteString("NOT ")
	switch n.kid.(type) {
	case *andNode, *orNode:
		b.WriteByte('(')
		n.kid.format(b)
		b.WriteByte(')')
	default:
		n.kid.format(b)
	}
}

type cmpOp uint8

const (
	opEq cmpOp = iota
	opNe
	opLt
	opLe
	opGt
	opGe
)

var opText = [...]string{opEq: "=", opNe: "<>", opLt: "<", opLe: "<=", opGt: ">", opGe: ">="}

// cmpNode is l op r. numeric is set at compile time when neither side forces
// a byte-wise comparison.
type cmpNode struct {
	op      cmpOp
	l, r    operand
	numeric bool
}

func (n *cmpNode) eval(rec Record) tri {
	a, ok := n.l.resolve(rec, n.numeric)
	if !ok {
		return tUnknown
	}
	b, ok := n.r.resolve(rec, n.numeric)
	if !ok {
		return tUnknown
	}
	switch n.op {
	case opEq:
		return of(equal(&a, &b, n.numeric))
	case opNe:
		return of(!equal(&a, &b, n.numeric))
	}
	c := compare(&a, &b, n.numeric)
	switch n.op {
	case opLt:
		return of(c < 0)
	case opLe:
		return of(c <= 0)
	case opGt:
		return of(c > 0)
	default:
		return of(c >= 0)
	}
}

func (n *cmpNode) format(b *strings.Builder) {
	n.l.format(b)
	b.WriteByte(' ')
	b.WriteString(opText[n.op])
	b.WriteByte(' ')
	n.r.format(b)
}

// inNode is x [NOT] IN (items); items are string and number literals.
type inNode struct {
	x       operand
	items   []operand
	neg     bool
	wantNum bool // some item is a number and x is not a string literal
}

func (n *inNode) eval(r Record) tri {
	v, ok := n.x.resolve(r, n.wantNum)
	if !ok {
		return tUnknown
	}
	stringX := n.x.stringy()
	for i := range n.items {
		it := &n.items[i]
		w, _ := it.resolve(r, false)
		if compare(&v, &w, !stringX && it.kind == oNumber) == 0 {
			return of(!n.neg)
		}
	}
	return of(n.neg)
}

func (n *inNode) format(b *strings.Builder) {
	n.x.format(b)
	if n.neg {
		b.WriteString(" NOT")
	}
	b.WriteString(" IN (")
	for i := range n.items {
		if i > 0 {
			b.WriteString(", ")
		}
		n.items[i].format(b)
	}
	b.WriteByte(')')
}

// betweenNode is x [NOT] BETWEEN lo AND hi, that is
// [NOT] (x >= lo AND x <= hi) in three-valued logic.
type betweenNode struct {
	x, lo, hi    operand
	neg          bool
	numLo, numHi bool
}

func (n *betweenNode) eval(r Record) tri {
	v, ok := n.x.resolve(r, n.numLo || n.numHi)
	if !ok {
		return tUnknown
	}
	lower, upper := tUnknown, tUnknown
	if lo, ok := n.lo.resolve(r, n.numLo); ok {
		lower = of(compare(&v, &lo, n.numLo) >= 0)
	}
	if hi, ok := n.hi.resolve(r, n.numHi); ok {
		upper = of(compare(&v, &hi, n.numHi) <= 0)
	}
	res := tUnknown
	switch {
	case lower == tFalse3 || upper == tFalse3:
		res = tFalse3
	case lower == tTrue3 && upper == tTrue3:
		res = tTrue3
	}
	if n.neg {
		return not3(res)
	}
	return res
}

func (n *betweenNode) format(b *strings.Builder) {
	n.x.format(b)
	if n.neg {
		b.WriteString(" NOT")
	}
	b.WriteString(" BETWEEN ")
	n.lo.format(b)
	b.WriteString(" AND ")
	n.hi.format(b)
}

// nullNode is x IS [NOT] NULL; it is never UNKNOWN.
type nullNode struct {
	x   operand
	neg bool
}

func (n *nullNode) eval(r Record) tri {
	_, ok := n.x.resolve(r, false)
	return of(ok == n.neg)
}

func (n *nullNode) format(b *strings.Builder) {
	n.x.format(b)
	if n.neg {
		b.WriteString(" IS NOT NULL")
	} else {
		b.WriteString(" IS NULL")
	}
}

func writeBool(b *strings.Builder, v bool) {
	if v {
		b.WriteString("TRUE")
	} else {
		b.WriteString("FALSE")
	}
}

func (o *operand) format(b *strings.Builder) {
	switch o.kind {
	case oHeader:
		writeIdent(b, o.name)
	case oKey:
		b.WriteString(keyField)
	case oString:
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(string(o.text), "'", "''"))
		b.WriteByte('\'')
	case oNumber:
		b.Write(o.text)
	case oBool:
		writeBool(b, o.b)
	}
}

// writeIdent writes a header name bare when it lexes back as the same plain
// identifier, else quoted with whichever quote needs no escaping ("" first).
func writeIdent(b *strings.Builder, name string) {
	if bareIdent(name) {
		b.WriteString(name)
		return
	}
	q := "\""
	if strings.Contains(name, q) && !strings.Contains(name, "`") {
		q = "`"
	}
	b.WriteString(q)
	b.WriteString(strings.ReplaceAll(name, q, q+q))
	b.WriteString(q)
}

func bareIdent(name string) bool {
	if name == "" || !isIdentStart(name[0]) || strings.HasPrefix(name, "__") {
		return false
	}
	for i := 1; i < len(name); i++ {
		if !isIdentPart(name[i]) {
			return false
		}
	}
	_, kw := keyword(name)
	return !kw
}
