// Package filter compiles the broker-side subscription filters of a consumer
// and evaluates them against records before delivery.
//
// It is pure: no goroutines, clock, disk or network. A *Filter is immutable
// once built and safe for concurrent use; the consumer-session actor that owns
// a subscription compiles its filter once, at subscribe time, and calls Match
// for each record it would deliver. A record that does not match is skipped but
// still advances progress (that is the caller's job).
//
// # Tag filters (ParseTags)
//
// RocketMQ style: "tagA || tagB" matches a record that carries at least one of
// the listed tags. "*" (or an empty or all-blank expression) matches every
// record. Tags are compared byte for byte, case-sensitively, after trimming
// the blanks around each one; a tag may hold any byte except '|' and control
// characters.
//
//	tags = "*" | tag { "||" tag } .
//
// # SQL filters (ParseSQL)
//
// A SQL-92 style search condition over the record's headers:
//
//	filter     = orExpr .
//	orExpr     = andExpr { "OR" andExpr } .
//	andExpr    = notExpr { "AND" notExpr } .
//	notExpr    = "NOT" notExpr | predicate .
//	predicate  = "(" orExpr ")"
//	           | boolean
//	           | operand compOp operand
//	           | operand [ "NOT" ] "IN" "(" literal { "," literal } ")"
//	           | operand [ "NOT" ] "BETWEEN" operand "AND" operand
//	           | operand "IS" [ "NOT" ] "NULL" .
//	compOp     = "=" | "<>" | "!=" | "<" | "<=" | ">" | ">=" .
//	operand    = identifier | literal | boolean .
//	literal    = string | number .
//	boolean    = "TRUE" | "FALSE" .
//	identifier = letter { letter | digit | "_" | "." }      (letter includes "_")
//	           | '"' { char | '""' } '"' | "`" { char | "``" } "`" .
//	string     = "'" { char | "''" } "'" .
//	number     = [ "-" ] digit { digit } [ "." digit { digit } ]
//	             [ ( "e" | "E" ) [ "+" | "-" ] digit { digit } ] .
//
// Keywords (AND OR NOT IN BETWEEN IS NULL TRUE FALSE) are case-insensitive
// and reserved: a header with such a name must be quoted ("and"). Header names
// are case-sensitive. Precedence, loosest first: OR, AND, NOT, then the
// predicates; BETWEEN's AND belongs to the BETWEEN. Booleans may be compared
// only with = and <> and may not appear in IN or BETWEEN.
//
// An identifier names a header. If a record carries a header twice, the first
// one counts. The bare identifier __key names the record key (NULL when the key
// is empty, since the wire cannot tell empty from absent); other bare names
// starting with "__" are reserved for pseudo-fields and rejected, so a header
// with such a name must be quoted ("__key" is the header, __key the key).
//
// # Values and comparison
//
// Header values are bytes. A comparison a OP b compares numerically when
// neither side is a string literal or a boolean and both sides are numbers: a
// numeric literal, or a header whose whole value has the number syntax above
// (optionally with a leading "+"), within float64 range. Otherwise it compares
// the bytes lexicographically, a numeric literal standing for its text as
// written. So with header amount="150", amount > 100 is true (numeric) while
// amount > '100' is also true but because "150" > "100" byte-wise, and with
// amount="abc", amount > 100 compares "abc" with "100" as strings (true).
// Integers compare exactly as int64; as soon as one side has a fraction or an
// exponent (or overflows int64) both are compared as float64.
//
// A boolean equals a non-boolean value whose bytes are "true" or "false"
// (ASCII case ignored) with the same truth; any other value is unequal.
//
// # Missing headers: three-valued logic
//
// A header the record lacks is NULL. Any comparison, IN or BETWEEN with a
// NULL operand is UNKNOWN; NOT UNKNOWN is UNKNOWN; FALSE AND UNKNOWN is FALSE,
// TRUE OR UNKNOWN is TRUE, and otherwise UNKNOWN propagates. A record matches
// only when the whole condition is TRUE, so with header a missing, neither
// a = 1 nor NOT (a = 1) matches, while a IS NULL does.
//
// # Limits and errors
//
// An expression longer than MaxLen bytes, or nesting parentheses and NOTs
// deeper than MaxDepth, is rejected. Parsing is linear in the length of the
// expression and evaluation never recurses deeper than MaxDepth. Every
// rejection is a *SyntaxError carrying the byte offset at which the problem
// was found; errors.Is(err, ErrTooLong) and errors.Is(err, ErrTooDeep) tell the
// limits apart from malformed input.
//
// Match does not allocate as long as the Record's methods do not; the
// FromProto adapter does not. Numeric comparisons parse the header on each
// call (integers without strconv; values with a fraction through
// strconv.ParseFloat, the bulk of Match's cost).
package filter
