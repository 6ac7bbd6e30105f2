// Package identity names the callers of mesh: every certificate carries
// exactly one SPIFFE URI SAN, spiffe://<trust-domain>/service/<role> for the
// three services and spiffe://<trust-domain>/<role>/<name> for nodes,
// operators and builders (DESIGN.md §8). The caller's identity is read once
// from the verified peer certificate and carried in the context.
package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is what a caller is; authorization policies list roles.
type Role string

// The roles of mesh. Catalog, signer and composer are services and have one
// identity each per trust domain; the others name one member of the role.
const (
	RoleCatalog  Role = "catalog"
	RoleSigner   Role = "signer"
	RoleComposer Role = "composer"
	RoleNode     Role = "node"
	RoleOperator Role = "operator"
	RoleBuilder  Role = "builder"
)

// Roles returns every role, services first, in a fixed order.
func Roles() []Role {
	return []Role{RoleCatalog, RoleSigner, RoleComposer, RoleNode, RoleOperator, RoleBuilder}
}

// IsService reports whether the role is one of the three services.
func (r Role) IsService() bool {
	switch r {
	case RoleCatalog, RoleSigner, RoleComposer:
		return true
	}
	return false
}

// Valid reports whether r is one of the six roles.
func (r Role) Valid() bool {
	switch r {
	case RoleCatalog, RoleSigner, RoleComposer, RoleNode, RoleOperator, RoleBuilder:
		return true
	}
	return false
}

// servicePath is the first path segment of a service's SPIFFE ID.
const servicePath = "service"

// scheme is the URI scheme of SPIFFE IDs.
const scheme = "spiffe"

var (
	// labelRE is a DNS label (DESIGN.md §2): node names are labels, and
	// operator and builder names follow the same rule so they are safe in
	// file names and log fields.
	labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// trustDomainRE is the SPIFFE trust domain alphabet, lower case only.
	trustDomainRE = regexp.MustCompile(`^[a-z0-9._-]+$`)
)

// ValidName reports whether name is a DNS label, the form of node, operator
// and builder names.
func ValidName(name string) bool { return labelRE.MatchString(name) }

// ValidateTrustDomain returns an error when td is not a SPIFFE trust domain
// name (lower-case letters, digits, '.', '-', '_'; at most 255 bytes).
func ValidateTrustDomain(td string) error {
	switch {
	case td == "":
		return errors.New("trust domain is empty")
	case len(td) > 255:
		return fmt.Errorf("trust domain is %d bytes, more than 255", len(td))
	case !trustDomainRE.MatchString(td):
		return fmt.Errorf("trust domain %q has characters outside [a-z0-9._-]", td)
	}
	return nil
}

// Identity is a caller: a role in a trust domain and, for nodes, operators
// and builders, a name. A service's Name is its role.
type Identity struct {
	TrustDomain string
	Role        Role
	Name        string
}

// New returns the identity of role named name in trust domain td, validated.
// For a service the name may be empty and is then the role's.
func New(td string, role Role, name string) (Identity, error) {
	if role.IsService() && name == "" {
		name = string(role)
	}
	id := Identity{TrustDomain: td, Role: role, Name: name}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// Validate returns an error naming what is wrong with id: a bad trust
// domain, an unknown role, a service whose name is not its role, or a name
// that is not a DNS label.
func (id Identity) Validate() error {
	if err := ValidateTrustDomain(id.TrustDomain); err != nil {
		return err
	}
	if !id.Role.Valid() {
		return fmt.Errorf("unknown role %q", id.Role)
	}
	if id.Role.IsService() {
		if id.Name != string(id.Role) {
			return fmt.Errorf("service %s must be named %q, not %q", id.Role, id.Role, id.Name)
		}
		return nil
	}
	if !ValidName(id.Name) {
		return fmt.Errorf("%s name %q is not a DNS label", id.Role, id.Name)
	}
	return nil
}

// IsService reports whether id is one of the three services.
func (id Identity) IsService() bool { return id.Role.IsService() }

// IsZero reports whether id is the zero Identity.
func (id Identity) IsZero() bool { return id == Identity{} }

// String returns the SPIFFE path without its leading slash, "service/signer"
// or "node/ace": short enough for logs and errors.
func (id Identity) String() string {
	if id.Role.IsService() {
		return servicePath + "/" + string(id.Role)
	}
	return string(id.Role) + "/" + id.Name
}

// URI returns the SPIFFE ID of id, spiffe://<trust-domain>/<String()>.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: scheme, Host: id.TrustDomain, Path: "/" + id.String()}
}

// Parse reads a SPIFFE ID into an Identity. It accepts only the forms of
// DESIGN.md §8: spiffe://<td>/service/{catalog,signer,composer} and
// spiffe://<td>/{node,operator,builder}/<dns-label>.
func Parse(uri string) (Identity, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Identity{}, fmt.Errorf("uri %q: %w", uri, err)
	}
	id, err := fromURL(u)
	if err != nil {
		return Identity{}, fmt.Errorf("uri %q: %w", uri, err)
	}
	return id, nil
}

// fromURL is Parse after url.Parse, shared with FromCertificate whose URI
// SANs arrive already parsed.
func fromURL(u *url.URL) (Identity, error) {
	switch {
	case u.Scheme != scheme:
		return Identity{}, fmt.Errorf("scheme is %q, not %q", u.Scheme, scheme)
	case u.Opaque != "":
		return Identity{}, errors.New("not a hierarchical spiffe:// URI")
	case u.User != nil:
		return Identity{}, errors.New("has user info")
	case u.Port() != "" || strings.HasSuffix(u.Host, ":"):
		return Identity{}, errors.New("has a port")
	case u.RawQuery != "" || u.ForceQuery:
		return Identity{}, errors.New("has a query")
	case u.Fragment != "" || u.RawFragment != "":
		return Identity{}, errors.New("has a fragment")
	case u.RawPath != "":
		// Percent-encoding would let two spellings name one identity.
		return Identity{}, errors.New("path is percent-encoded")
	}
	if err := ValidateTrustDomain(u.Host); err != nil {
		return Identity{}, err
	}
	if u.Path == "" || u.Path == "/" {
		return Identity{}, errors.New("has no path")
	}
	segs := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(segs) != 2 {
		return Identity{}, fmt.Errorf("path %q has %d segments, want 2 (<role>/<name> or service/<role>)", u.Path, len(segs))
	}
	kind, name := segs[0], segs[1]
	if kind == servicePath {
		role := Role(name)
		if !role.IsService() {
			return Identity{}, fmt.Errorf("unknown service %q (want catalog, signer or composer)", name)
		}
		return Identity{TrustDomain: u.Host, Role: role, Name: name}, nil
	}
	role := Role(kind)
	switch {
	case role.IsService():
		return Identity{}, fmt.Errorf("role %s is a service: its path is /service/%s", role, role)
	case !role.Valid():
		return Identity{}, fmt.Errorf("unknown role %q (want service, node, operator or builder)", kind)
	case !ValidName(name):
		return Identity{}, fmt.Errorf("%s name %q is not a DNS label", role, name)
	}
	return Identity{TrustDomain: u.Host, Role: role, Name: name}, nil
}

// FromCertificate reads the identity of a leaf certificate, which must carry
// exactly one URI SAN holding a valid SPIFFE ID.
func FromCertificate(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, errors.New("no certificate")
	}
	if cert.IsCA {
		return Identity{}, errors.New("certificate is a CA, not a leaf")
	}
	switch n := len(cert.URIs); n {
	case 0:
		return Identity{}, errors.New("certificate has no URI SAN")
	case 1:
	default:
		return Identity{}, fmt.Errorf("certificate has %d URI SANs, want exactly 1", n)
	}
	id, err := fromURL(cert.URIs[0])
	if err != nil {
		return Identity{}, fmt.Errorf("certificate URI SAN %q: %w", cert.URIs[0], err)
	}
	return id, nil
}

// FromPeer reads the identity of the gRPC peer from its verified certificate
// chain. It fails when the connection is not TLS or the peer presented no
// certificate that was verified.
func FromPeer(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, errors.New("no peer in context")
	}
	if p.AuthInfo == nil {
		return Identity{}, errors.New("peer is not authenticated")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, fmt.Errorf("peer is authenticated by %s, not tls", p.AuthInfo.AuthType())
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return Identity{}, errors.New("peer presented no verified certificate")
	}
	return FromCertificate(chains[0][0])
}

type ctxKey struct{}

// NewContext returns a context carrying id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity NewContext put into ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}
