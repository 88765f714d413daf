package filter

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

const (
	// MaxLen is the longest expression, in bytes, that ParseSQL and ParseTags
	// accept.
	MaxLen = 4096
	// MaxDepth is how deeply parentheses and NOTs may nest in a SQL filter.
	MaxDepth = 64
)

var (
	// ErrTooLong marks the *SyntaxError of an expression longer than MaxLen.
	ErrTooLong = errors.New("filter: expression too long")
	// ErrTooDeep marks the *SyntaxError of an expression nested deeper than
	// MaxDepth.
	ErrTooDeep = errors.New("filter: expression nested too deeply")
)

// SyntaxError is how ParseSQL and ParseTags reject an expression. Pos is the
// byte offset in the expression (0-based) where the problem was found: the
// start of the offending token, or len(expr) when the expression ended too
// soon. The consumer returns Error() to the subscriber as is.
type SyntaxError struct {
	Pos int
	Msg string

	cause error // ErrTooLong, ErrTooDeep or nil
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("filter: at %d: %s", e.Pos, e.Msg)
}

// Unwrap returns ErrTooLong or ErrTooDeep for a limit violation, else nil.
func (e *SyntaxError) Unwrap() error { return e.cause }

// Caret renders the line of expr that holds e.Pos with a caret under it:
//
//	region = 'eu' AND (amount > 100
//	                               ^
//
// Columns are counted in runes, and tabs before Pos are kept, so the caret
// lines up in a terminal. A Pos outside expr is clamped to it.
func (e *SyntaxError) Caret(expr string) string {
	pos := min(max(e.Pos, 0), len(expr))
	start := strings.LastIndexByte(expr[:pos], '\n') + 1
	end := len(expr)
	if i := strings.IndexByte(expr[pos:], '\n'); i >= 0 {
		end = pos + i
	}
	line := strings.TrimSuffix(expr[start:end], "\r")
	var b strings.Builder
	b.WriteString(line)
	b.WriteByte('\n')
	for _, r := range expr[start:pos] {
		if r == '\t' {
			b.WriteByte('\t')
		} else {
			b.WriteByte(' ')
		}
	}
	b.WriteByte('^')
	return b.String()
}

func errAt(pos int, format string, args ...any) *SyntaxError {
	return &SyntaxError{Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

func tooLong(n int) *SyntaxError {
	return &SyntaxError{
		Pos:   MaxLen,
		Msg:   fmt.Sprintf("expression is %d bytes; the limit is %d", n, MaxLen),
		cause: ErrTooLong,
	}
}

func tooDeep(pos int) *SyntaxError {
	return &SyntaxError{
		Pos:   pos,
		Msg:   fmt.Sprintf("expression nests more than %d parentheses and NOTs", MaxDepth),
		cause: ErrTooDeep,
	}
}

// quoteSnippet shows a piece of the expression in an error message: in single
// quotes, cut after 24 bytes, with invalid UTF-8 and control characters
// escaped.
func quoteSnippet(s string) string {
	const maxShown = 24
	cut := false
	if len(s) > maxShown {
		s = s[:maxShown]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		cut = true
	}
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	if cut {
		b.WriteString("...")
	}
	b.WriteByte('\'')
	return b.String()
}
