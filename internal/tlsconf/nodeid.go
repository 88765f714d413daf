package tlsconf

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// A node certificate names the node ids it may register as with URI
// subject alternative names urn:herald:node:ID: the controller registers
// a node id only from a node whose certificate names it.

const nodeURNPrefix = "urn:herald:node:"

// NodeURI is node id's URI.
func NodeURI(id uint64) *url.URL {
	u, _ := url.Parse(nodeURNPrefix + strconv.FormatUint(id, 10))
	return u
}

// NodeIDs are the node ids cert names.
func NodeIDs(cert *x509.Certificate) []uint64 {
	var out []uint64
	for _, u := range cert.URIs {
		if s, ok := strings.CutPrefix(u.String(), nodeURNPrefix); ok {
			if id, err := strconv.ParseUint(s, 10, 64); err == nil && id != 0 {
				out = append(out, id)
			}
		}
	}
	return out
}

// NamesNode reports whether cert names node id, and if not, says what it
// names.
func NamesNode(cert *x509.Certificate, id uint64) error {
	ids := NodeIDs(cert)
	for _, x := range ids {
		if x == id {
			return nil
		}
	}
	if len(ids) == 0 {
		return fmt.Errorf("the certificate %q names no node id (it needs the URI %s%d)", cert.Subject.CommonName, nodeURNPrefix, id)
	}
	return fmt.Errorf("the certificate %q names node %v, not node %d", cert.Subject.CommonName, ids, id)
}
