// Package pass writes one node (DESIGN.md §5.2): it renders the node's
// declaration, splits it, moves large content to the object store, compares
// each composition with the one held, signs and writes what differs with CAS,
// judges each against what the node applied, decides the node's wants and
// holds, and commits the node's assignment with its signed manifest — the
// commit point — then records status and prunes. The same code computes a
// Plan without writing anything.
package pass

import (
	"context"
	"errors"
	"time"

	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"

	"mesh.dev/internal/verify"
)

// Release is a fingerprint's entry with its decoded manifest.
type Release struct {
	Entry    *catalogv1.Entry
	Manifest *typev1.ModuleManifest
}

// ErrNoEntry is returned by Catalog.Entry when the catalog holds no entry of
// the fingerprint, ErrNoBuild by Catalog.Build when it holds no build.
var (
	ErrNoEntry = errors.New("no entry")
	ErrNoBuild = errors.New("no build")
)

// Catalog is what a pass reads of the catalog: registrations (kept current by
// a watch), entries (immutable, cached) and builds (cached once DONE).
type Catalog interface {
	Registration(module string) (*catalogv1.Registration, bool)
	Entry(ctx context.Context, fp string) (*Release, error)
	Build(ctx context.Context, fp string) (*catalogv1.Build, error)
}

// Signer signs for the lease holder under a fencing epoch: the one of the
// tenure the pass started under.
type Signer interface {
	SignCompositions(ctx context.Context, epoch uint64, comps []*typev1.Composition) ([]*signerv1.SignedItem, error)
	SignManifests(ctx context.Context, epoch uint64, items []*signerv1.ManifestItem) ([]*signerv1.SignedManifest, error)
}

// Trust is the keyset a held composition must verify against and the id of
// the key the signer signs with now: a held composition signed by another key
// is signed again, so a rotation re-signs everything before the old key goes.
type Trust interface {
	Keyring() *verify.Keyring
	SigningKeyID() string
	// Stale says the signer is ahead of the keyset held (a signature by
	// a key it does not list, a manifest of a newer keyset version).
	Stale()
}

// Lease tells whether this composer may still write, with at least margin
// left before its lease expires, and the fencing epoch of the tenure it
// holds the lease in.
type Lease interface {
	Check(margin time.Duration) (epoch uint64, err error)
}

// Approvals returns the current approvals (kept by a watch).
type Approvals interface {
	Approvals() []*composerv1.Approval
}
