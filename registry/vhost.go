package registry

import (
	"regexp"
	"strings"
)

// Vhosts (tenants) are namespaces of names: a topic, consumer group,
// transactional id or producer group that a client of vhost V names N is
// the broker's V~N. The default vhost ("/") adds nothing, so data made
// before vhosts existed stays where it is. Client names never hold the
// separator (netio refuses them), so no client reaches another vhost's
// names.

// DefaultVhost is the default vhost's name.
const DefaultVhost = "/"

// VhostSep separates a vhost from a name in the broker's names.
const VhostSep = "~"

var validVhost = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidVhost reports whether name may name a vhost (other than the
// default): 1-64 characters of A-Z a-z 0-9 . _ -.
func ValidVhost(name string) bool { return validVhost.MatchString(name) && name != "." && name != ".." }

// IsDefaultVhost reports whether vhost names the default vhost.
func IsDefaultVhost(vhost string) bool { return vhost == "" || vhost == DefaultVhost }

// InVhost is the broker's name of vhost's name.
func InVhost(vhost, name string) string {
	if IsDefaultVhost(vhost) {
		return name
	}
	return vhost + VhostSep + name
}

// VhostOf splits a broker's name into its vhost (DefaultVhost for none)
// and the name the vhost's clients use.
func VhostOf(name string) (vhost, local string) {
	if v, n, ok := strings.Cut(name, VhostSep); ok {
		return v, n
	}
	return DefaultVhost, name
}

// InVhostOf reports whether a broker's name belongs to vhost.
func InVhostOf(vhost, name string) bool {
	v, _ := VhostOf(name)
	return v == vhost || IsDefaultVhost(vhost) && v == DefaultVhost
}
