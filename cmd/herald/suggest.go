package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// The CLI's "did you mean" and plural helpers.

// suggest returns the known words nearest to typed by edit distance
// (case-insensitive; a swap of two neighbouring letters counts as one
// edit), or nil when none is close: at most one edit, or two for a word
// of four or more letters. A typed word of three or more letters that
// begins exactly one known word suggests it too (--part for --partitions).
// Ties are all returned, sorted.
func suggest(typed string, known []string) []string {
	t := strings.ToLower(typed)
	best, out := 3, []string(nil)
	for _, k := range known {
		d := editDistance(t, strings.ToLower(k))
		if d > 2 || d == 2 && len(t) < 4 {
			continue
		}
		switch {
		case d < best:
			best, out = d, []string{k}
		case d == best:
			out = append(out, k)
		}
	}
	if out == nil && len(t) >= 3 {
		for _, k := range known {
			if strings.HasPrefix(strings.ToLower(k), t) {
				out = append(out, k)
			}
		}
		if len(out) != 1 {
			return nil
		}
	}
	sort.Strings(out)
	return out
}

// editDistance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent bytes.
func editDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// didYouMean is "; did you mean X?" (or "X or Y"), each of words prefixed
// with prefix, or "" when words is empty.
func didYouMean(prefix string, words []string) string {
	if len(words) == 0 {
		return ""
	}
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = prefix + w
	}
	return "; did you mean " + strings.Join(q, " or ") + "?"
}

// flagNames lists the flags defined in fs.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// flagParseError turns an error of fs.Parse into a usage error. An unknown
// flag is named as typed on the command line would be (--name), with the
// nearest known flag when one is close ("unknown flag --gruop; did you
// mean --group?"), else with where to find the flags.
func flagParseError(fs *flag.FlagSet, err error) error {
	const undefined = "flag provided but not defined: -"
	name, ok := strings.CutPrefix(err.Error(), undefined)
	if !ok {
		return usagef("%v", err)
	}
	if s := didYouMean("--", suggest(name, flagNames(fs))); s != "" {
		return usagef("unknown flag --%s%s", name, s)
	}
	return usagef("unknown flag --%s (see '%s -h')", name, fs.Name())
}

// parseQuietly runs fs.Parse without the flag package's usage dump on a
// parse error: the one-line error says what is wrong (and the nearest flag)
// and a 30-line dump above it would bury it. -h still prints the usage.
func parseQuietly(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard) // the flag package prints the error too
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) && usage != nil {
		usage()
	}
	return err
}

// plural is "1 record", "2 records", "0 records": n and noun, made plural
// unless n is 1 (a noun ending in a consonant and y ends in ies: "retries").
func plural[N ~int | ~int32 | ~int64 | ~uint32 | ~uint64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if l := len(noun); l >= 2 && noun[l-1] == 'y' && !strings.ContainsRune("aeiou", rune(noun[l-2])) {
		return fmt.Sprintf("%d %sies", n, noun[:l-1])
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// wasWere is the verb that agrees with a count of n.
func wasWere[N ~int | ~int32 | ~int64 | ~uint32 | ~uint64](n N) string {
	if n == 1 {
		return "was"
	}
	return "were"
}
