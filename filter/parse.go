package filter

import (
	"strings"
)

// keyField is the pseudo-field that names the record key.
const keyField = "__key"

// parser is a recursive-descent parser over the token slice. Recursion
// happens only for parentheses and NOT, and depth counts both.
type parser struct {
	src   string
	toks  []token
	i     int
	depth int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) unexpected(want string) error {
	t := p.peek()
	return errAt(t.pos, "expected %s but found %s", want, t.describe(p.src))
}

func (p *parser) enter(pos int) error {
	p.depth++
	if p.depth > MaxDepth {
		return tooDeep(pos)
	}
	return nil
}

func parseSQL(src string) (node, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{src: src, toks: toks}
	n, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tEOF {
		return nil, p.unexpected("AND, OR or end of expression")
	}
	return n, nil
}

func (p *parser) parseOr() (node, error) {
	first, err := p.parseAnd()
	if err != nil || p.peek().kind != tOr {
		return first, err
	}
	var kids []node
	add := func(n node) {
		if o, ok := n.(*orNode); ok { // (a OR b) OR c: OR is associative
			kids = append(kids, o.kids...)
		} else {
			kids = append(kids, n)
		}
	}
	add(first)
	for p.peek().kind == tOr {
		p.next()
		n, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		add(n)
	}
	return &orNode{kids: kids}, nil
}

func (p *parser) parseAnd() (node, error) {
	first, err := p.parseNot()
	if err != nil || p.peek().kind != tAnd {
		return first, err
	}
	var kids []node
	add := func(n node) {
		if a, ok := n.(*andNode); ok {
			kids = append(kids, a.kids...)
		} else {
			kids = append(kids, n)
		}
	}
	add(first)
	for p.peek().kind == tAnd {
		p.next()
		n, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		add(n)
	}
	return &andNode{kids: kids}, nil
}

func (p *parser) parseNot() (node, error) {
	if p.peek().kind != tNot {
		return p.parsePredicate()
	}
	t := p.next()
	if err := p.enter(t.pos); err != nil {
		return nil, err
	}
	kid, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	p.depth--
	return &notNode{kid: kid}, nil
}

func (p *parser) parsePredicate() (node, error) {
	if p.peek().kind == tLParen {
		t := p.next()
		if err := p.enter(t.pos); err != nil {
			return nil, err
		}
		n, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		if p.peek().kind != tRParen {
			return nil, p.unexpected("')'")
		}
		p.next()
		p.depth--
		return n, nil
	}
	x, err := p.parseOperand("a condition")
	if err != nil {
		return nil, err
	}
	t := p.peek()
	switch t.kind {
	case tEq, tNe, tLt, tLe, tGt, tGe:
		p.next()
		return p.parseComparison(t, x)
	case tNot:
		p.next()
		switch p.peek().kind {
		case tIn:
			p.next()
			return p.parseIn(x, true)
		case tBetween:
			p.next()
			return p.parseBetween(x, true)
		}
		return nil, p.unexpected("IN or BETWEEN after NOT")
	case tIn:
		p.next()
		return p.parseIn(x, false)
	case tBetween:
		p.next()
		return p.parseBetween(x, false)
	case tIs:
		p.next()
		neg := false
		if p.peek().kind == tNot {
			p.next()
			neg = true
		}
		if p.peek().kind != tNull {
			return nil, p.unexpected("NULL")
		}
		p.next()
		return &nullNode{x: x, neg: neg}, nil
	}
	if x.kind == oBool {
		return &constNode{v: x.b}, nil
	}
	return nil, p.unexpected("a comparison operator, IN, BETWEEN or IS")
}

func (p *parser) parseComparison(opTok token, x operand) (node, error) {
	y, err := p.parseOperand("a header name or a literal")
	if err != nil {
		return nil, err
	}
	var op cmpOp
	switch opTok.kind {
	case tEq:
		op = opEq
	case tNe:
		op = opNe
	case tLt:
		op = opLt
	case tLe:
		op = opLe
	case tGt:
		op = opGt
	default:
		op = opGe
	}
	if op != opEq && op != opNe && (x.kind == oBool || y.kind == oBool) {
		return nil, errAt(opTok.pos, "booleans compare only with '=' and '<>'")
	}
	return &cmpNode{op: op, l: x, r: y, numeric: !x.stringy() && !y.stringy()}, nil
}

func (p *parser) parseIn(x operand, neg bool) (node, error) {
	if x.kind == oBool {
		return nil, errAt(x.pos, "IN does not take a boolean")
	}
	if p.peek().kind != tLParen {
		return nil, p.unexpected("'(' after IN")
	}
	p.next()
	n := &inNode{x: x, neg: neg}
	for {
		t := p.peek()
		if t.kind != tString && t.kind != tNumber {
			return nil, p.unexpected("a string or number literal")
		}
		it, err := p.parseOperand("")
		if err != nil {
			return nil, err
		}
		n.items = append(n.items, it)
		if it.kind == oNumber && !x.stringy() {
			n.wantNum = true
		}
		switch p.peek().kind {
		case tComma:
			p.next()
			continue
		case tRParen:
			p.next()
			return n, nil
		}
		return nil, p.unexpected("',' or ')'")
	}
}

func (p *parser) parseBetween(x operand, neg bool) (node, error) {
	lo, err := p.parseOperand("a header name or a literal")
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tAnd {
		return nil, p.unexpected("AND of BETWEEN")
	}
	p.next()
	hi, err := p.parseOperand("a header name or a literal")
	if err != nil {
		return nil, err
	}
	for _, o := range []*operand{&x, &lo, &hi} {
		if o.kind == oBool {
			return nil, errAt(o.pos, "BETWEEN does not take a boolean")
		}
	}
	return &betweenNode{
		x: x, lo: lo, hi: hi, neg: neg,
		numLo: !x.stringy() && !lo.stringy(),
		numHi: !x.stringy() && !hi.stringy(),
	}, nil
}

// parseOperand reads an identifier, literal or boolean; want describes what
// was expected, for the error.
func (p *parser) parseOperand(want string) (operand, error) {
	t := p.peek()
	o := operand{pos: t.pos}
	switch t.kind {
	case tIdent:
		if strings.HasPrefix(t.val, "__") {
			if t.val != keyField {
				return o, errAt(t.pos, "unknown pseudo-field %s; quote a header name that starts with '__'", quoteSnippet(t.val))
			}
			o.kind = oKey
		} else {
			o.kind, o.name = oHeader, t.val
		}
	case tQIdent:
		o.kind, o.name = oHeader, t.val
	case tString:
		o.kind, o.text = oString, []byte(t.val)
	case tNumber:
		n, ok := parseNumString(t.val, false)
		if !ok {
			return o, errAt(t.pos, "number %s is out of range", quoteSnippet(t.val))
		}
		o.kind, o.text, o.n = oNumber, []byte(t.val), n
	case tTrue, tFalse:
		o.kind, o.b = oBool, t.kind == tTrue
	default:
		return o, p.unexpected(want)
	}
	p.next()
	return o, nil
}
