// Package scramcred derives and checks the SCRAM-SHA-256 credentials a
// broker stores for a user (RFC 5802: salt, iterations, StoredKey,
// ServerKey; never the password). The CLI derives them on the client's
// side, so a password never crosses the network; the broker derives the
// --bootstrap-user's from its password file.
package scramcred

import (
	"crypto/rand"
	"fmt"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// MinIterations is the fewest PBKDF2 iterations a credential may have
// (RFC 7677 asks for at least 4096); DefaultIterations is what `herald
// user add` uses unless told otherwise.
const (
	MinIterations     = 4096
	DefaultIterations = 8192
	// MaxIterations bounds the work a login costs the client.
	MaxIterations = 1 << 20
	saltBytes     = 16
	keyBytes      = 32 // SHA-256
)

// New derives name's credentials from password with a fresh random salt.
// The name matters only to SASLprep's checks; the credentials do not
// depend on it.
func New(name, password string, iterations int) (*heraldpb.ScramCredential, error) {
	if iterations == 0 {
		iterations = DefaultIterations
	}
	if iterations < MinIterations || iterations > MaxIterations {
		return nil, fmt.Errorf("iterations %d: must be in [%d, %d]", iterations, MinIterations, MaxIterations)
	}
	if password == "" {
		return nil, fmt.Errorf("the password is empty")
	}
	c, err := scram.SHA256.NewClient(name, password, "")
	if err != nil {
		return nil, fmt.Errorf("the name or password is not valid for SCRAM (SASLprep): %w", err)
	}
	salt := make([]byte, saltBytes)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	sc, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iterations})
	if err != nil {
		return nil, err
	}
	return &heraldpb.ScramCredential{Salt: salt, Iterations: uint32(iterations), StoredKey: sc.StoredKey, ServerKey: sc.ServerKey}, nil
}

// Check reports what is wrong with credentials a client sent, or nil.
func Check(c *heraldpb.ScramCredential) error {
	switch {
	case c == nil:
		return fmt.Errorf("no SCRAM-SHA-256 credentials")
	case c.Iterations < MinIterations || c.Iterations > MaxIterations:
		return fmt.Errorf("iterations %d: must be in [%d, %d]", c.Iterations, MinIterations, MaxIterations)
	case len(c.Salt) < saltBytes || len(c.Salt) > 256:
		return fmt.Errorf("salt of %d bytes: must be %d to 256", len(c.Salt), saltBytes)
	case len(c.StoredKey) != keyBytes || len(c.ServerKey) != keyBytes:
		return fmt.Errorf("stored and server keys must be %d bytes (SHA-256)", keyBytes)
	}
	return nil
}
