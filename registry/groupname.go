package registry

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	heraldpb "github.com/heraldmq/herald/proto"
)

var validGroup = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// CheckGroupName refuses a group name a subscription may not create: one
// that is not 1-200 characters of A-Z a-z 0-9 . _ -, or that starts with
// "__" (reserved, like internal topic names: a group's dead-letter topic
// is named after it). The message quotes at most the name's first
// maxQuoted characters.
func CheckGroupName(name string) *heraldpb.Error {
	vhost, local := VhostOf(name)
	if !IsDefaultVhost(vhost) && !ValidVhost(vhost) {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "group name %s: bad vhost", QuoteName(name))
	}
	name = local
	if !validGroup.MatchString(name) {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "group name %s must be 1-200 characters of A-Z a-z 0-9 . _ -", QuoteName(name))
	}
	if strings.HasPrefix(name, "__") {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "group name %q: names starting with __ are reserved", name)
	}
	return nil
}

// maxQuoted is how many characters of a client's name an error message
// quotes at most.
const maxQuoted = 64

// QuoteName quotes name for an error message, cut to its first maxQuoted
// characters (bytes) with its length said when longer.
func QuoteName(name string) string {
	if len(name) <= maxQuoted {
		return strconv.Quote(name)
	}
	cut := name[:maxQuoted]
	for !utf8.ValidString(cut) && len(cut) > 0 {
		cut = cut[:len(cut)-1]
	}
	return fmt.Sprintf("%q... (%d bytes)", cut, len(name))
}
