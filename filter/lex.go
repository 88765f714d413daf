package filter

import (
	"strings"
	"unicode/utf8"
)

type tokKind uint8

const (
	tEOF tokKind = iota
	tIdent
	tQIdent // "quoted" or `quoted`
	tString
	tNumber
	tLParen
	tRParen
	tComma
	tEq
	tNe
	tLt
	tLe
	tGt
	tGe
	tAnd
	tOr
	tNot
	tIn
	tBetween
	tIs
	tNull
	tTrue
	tFalse
)

var keywords = [...]struct {
	word string
	kind tokKind
}{
	{"AND", tAnd}, {"OR", tOr}, {"NOT", tNot}, {"IN", tIn}, {"BETWEEN", tBetween},
	{"IS", tIs}, {"NULL", tNull}, {"TRUE", tTrue}, {"FALSE", tFalse},
}

func keyword(s string) (tokKind, bool) {
	for _, k := range keywords {
		if strings.EqualFold(s, k.word) {
			return k.kind, true
		}
	}
	return 0, false
}

// token is one lexeme. val is the decoded content of identifiers and strings
// and the text of numbers; end is the offset just past the token.
type token struct {
	kind     tokKind
	pos, end int
	val      string
}

// describe names the token in an error message: "'AND'", "end of expression".
func (t token) describe(src string) string {
	if t.kind == tEOF {
		return "end of expression"
	}
	return quoteSnippet(src[t.pos:t.end])
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}
func isDigit(c byte) bool      { return '0' <= c && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }
func isIdentPart(c byte) bool  { return isIdentStart(c) || isDigit(c) || c == '.' }

// lex splits src into tokens, ending with one tEOF at len(src). It runs in
// time linear in len(src).
func lex(src string) ([]token, error) {
	var toks []token
	i := 0
	for {
		for i < len(src) && isSpace(src[i]) {
			i++
		}
		if i == len(src) {
			return append(toks, token{kind: tEOF, pos: i, end: i}), nil
		}
		start := i
		c := src[i]
		var kind tokKind
		val := ""
		switch {
		case c == '(':
			kind, i = tLParen, i+1
		case c == ')':
			kind, i = tRParen, i+1
		case c == ',':
			kind, i = tComma, i+1
		case c == '=':
			kind, i = tEq, i+1
			if i < len(src) && src[i] == '=' {
				return nil, errAt(start, "unexpected '=='; SQL compares with '='")
			}
		case c == '<':
			kind, i = tLt, i+1
			if i < len(src) && src[i] == '=' {
				kind, i = tLe, i+1
			} else if i < len(src) && src[i] == '>' {
				kind, i = tNe, i+1
			}
		case c == '>':
			kind, i = tGt, i+1
			if i < len(src) && src[i] == '=' {
				kind, i = tGe, i+1
			}
		case c == '!':
			if i+1 < len(src) && src[i+1] == '=' {
				kind, i = tNe, i+2
			} else {
				return nil, errAt(start, "unexpected '!'; negate with NOT")
			}
		case c == '\'' || c == '"' || c == '`':
			var err error
			val, i, err = lexQuoted(src, i)
			if err != nil {
				return nil, err
			}
			kind = tString
			if c != '\'' {
				kind = tQIdent
				if val == "" {
					return nil, errAt(start, "empty quoted identifier")
				}
			}
		case isDigit(c) || (c == '-' && i+1 < len(src) && isDigit(src[i+1])):
			n, ok := scanNumber(src[i:], false)
			i += n
			if !ok || (i < len(src) && isIdentPart(src[i])) {
				for i < len(src) && (isIdentPart(src[i]) || src[i] == '-' || src[i] == '+') {
					i++
				}
				return nil, errAt(start, "malformed number %s", quoteSnippet(src[start:i]))
			}
			kind, val = tNumber, src[start:i]
		case isIdentStart(c):
			for i < len(src) && isIdentPart(src[i]) {
				i++
			}
			val = src[start:i]
			if k, ok := keyword(val); ok {
				kind = k
			} else {
				kind = tIdent
			}
		default:
			r, _ := utf8.DecodeRuneInString(src[i:])
			if r == utf8.RuneError || r < 0x20 || r == 0x7f {
				return nil, errAt(start, "unexpected byte %s", quoteSnippet(src[i:i+1]))
			}
			return nil, errAt(start, "unexpected character %s", quoteSnippet(string(r)))
		}
		toks = append(toks, token{kind: kind, pos: start, end: i, val: val})
	}
}

// lexQuoted reads the quoted string or identifier that starts at src[i],
// where a doubled quote stands for one. It returns the content and the
// offset just past the closing quote.
func lexQuoted(src string, i int) (string, int, error) {
	q := src[i]
	start := i
	i++
	var b strings.Builder // used only once an escape is seen
	from := i
	for {
		j := strings.IndexByte(src[i:], q)
		if j < 0 {
			what := "string literal"
			if q != '\'' {
				what = "quoted identifier"
			}
			return "", 0, errAt(start, "unterminated %s", what)
		}
		i += j
		if i+1 < len(src) && src[i+1] == q {
			b.WriteString(src[from : i+1])
			i += 2
			from = i
			continue
		}
		if b.Len() == 0 && from == start+1 {
			return src[from:i], i + 1, nil
		}
		b.WriteString(src[from:i])
		return b.String(), i + 1, nil
	}
}

// scanNumber reports how many bytes of s form a number and whether they do:
// [sign] digits ["." digits] [("e"|"E") [sign] digits], where the leading sign
// may be "-", or also "+" when plus is set. It stops at the first byte that
// cannot continue the number and fails on a dangling ".", exponent or sign.
func scanNumber(s string, plus bool) (int, bool) {
	i := 0
	if i < len(s) && (s[i] == '-' || (plus && s[i] == '+')) {
		i++
	}
	d := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i == d {
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		d = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == d {
			return i, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == d {
			return i, false
		}
	}
	return i, true
}
