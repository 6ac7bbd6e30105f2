package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		uri     string
		want    Identity
		wantErr string
	}{
		{name: "catalog", uri: "spiffe://mesh.local/service/catalog", want: Identity{"mesh.local", RoleCatalog, "catalog"}},
		{name: "signer", uri: "spiffe://mesh.local/service/signer", want: Identity{"mesh.local", RoleSigner, "signer"}},
		{name: "composer", uri: "spiffe://mesh.local/service/composer", want: Identity{"mesh.local", RoleComposer, "composer"}},
		{name: "node", uri: "spiffe://mesh.local/node/ace", want: Identity{"mesh.local", RoleNode, "ace"}},
		{name: "operator", uri: "spiffe://mesh.local/operator/admin", want: Identity{"mesh.local", RoleOperator, "admin"}},
		{name: "builder", uri: "spiffe://mesh.local/builder/ci-1", want: Identity{"mesh.local", RoleBuilder, "ci-1"}},
		{name: "longest label", uri: "spiffe://td/node/" + strings.Repeat("a", 63), want: Identity{"td", RoleNode, strings.Repeat("a", 63)}},
		{name: "trust domain alphabet", uri: "spiffe://a_b-c.9/node/x", want: Identity{"a_b-c.9", RoleNode, "x"}},

		{name: "not spiffe", uri: "https://mesh.local/node/ace", wantErr: `scheme is "https", not "spiffe"`},
		{name: "opaque", uri: "spiffe:node/ace", wantErr: "not a hierarchical spiffe:// URI"},
		{name: "no trust domain", uri: "spiffe:///node/ace", wantErr: "trust domain is empty"},
		{name: "upper-case trust domain", uri: "spiffe://Mesh.Local/node/ace", wantErr: "has characters outside [a-z0-9._-]"},
		{name: "port", uri: "spiffe://mesh.local:8443/node/ace", wantErr: "has a port"},
		{name: "user info", uri: "spiffe://u@mesh.local/node/ace", wantErr: "has user info"},
		{name: "query", uri: "spiffe://mesh.local/node/ace?x=1", wantErr: "has a query"},
		{name: "fragment", uri: "spiffe://mesh.local/node/ace#x", wantErr: "has a fragment"},
		{name: "percent-encoded", uri: "spiffe://mesh.local/node/a%2Fb", wantErr: "path is percent-encoded"},
		{name: "no path", uri: "spiffe://mesh.local", wantErr: "has no path"},
		{name: "root path", uri: "spiffe://mesh.local/", wantErr: "has no path"},
		{name: "one segment", uri: "spiffe://mesh.local/node", wantErr: "has 1 segments"},
		{name: "extra segment", uri: "spiffe://mesh.local/node/ace/extra", wantErr: "has 3 segments"},
		{name: "trailing slash", uri: "spiffe://mesh.local/node/ace/", wantErr: "has 3 segments"},
		{name: "empty segment", uri: "spiffe://mesh.local/node//ace", wantErr: "has 3 segments"},
		{name: "unknown role", uri: "spiffe://mesh.local/admin/ace", wantErr: `unknown role "admin"`},
		{name: "unknown service", uri: "spiffe://mesh.local/service/node", wantErr: `unknown service "node"`},
		{name: "service as role", uri: "spiffe://mesh.local/signer/x", wantErr: "role signer is a service: its path is /service/signer"},
		{name: "upper-case name", uri: "spiffe://mesh.local/node/Ace", wantErr: `node name "Ace" is not a DNS label`},
		{name: "name with dot", uri: "spiffe://mesh.local/node/a.b", wantErr: `node name "a.b" is not a DNS label`},
		{name: "name leading dash", uri: "spiffe://mesh.local/operator/-a", wantErr: `operator name "-a" is not a DNS label`},
		{name: "name trailing dash", uri: "spiffe://mesh.local/builder/a-", wantErr: `builder name "a-" is not a DNS label`},
		{name: "name too long", uri: "spiffe://mesh.local/node/" + strings.Repeat("a", 64), wantErr: "is not a DNS label"},
		{name: "dot-dot name", uri: "spiffe://mesh.local/node/..", wantErr: `node name ".." is not a DNS label`},
		{name: "unparseable", uri: "spiffe://mesh.local/node/%zz", wantErr: "invalid URL escape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tt.uri)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse(%q) = %+v, want an error containing %q", tt.uri, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %q, want it to contain %q", tt.uri, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.uri, err)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tt.uri, got, tt.want)
			}
			// Round trip: the URI of what was parsed is what was parsed.
			if s := got.URI().String(); s != tt.uri {
				t.Errorf("URI() = %q, want %q", s, tt.uri)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate() of a parsed identity: %v", err)
			}
		})
	}
}

func TestIdentityStringAndService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id      Identity
		str     string
		service bool
	}{
		{Identity{"td", RoleSigner, "signer"}, "service/signer", true},
		{Identity{"td", RoleCatalog, "catalog"}, "service/catalog", true},
		{Identity{"td", RoleComposer, "composer"}, "service/composer", true},
		{Identity{"td", RoleNode, "ace"}, "node/ace", false},
		{Identity{"td", RoleOperator, "admin"}, "operator/admin", false},
		{Identity{"td", RoleBuilder, "ci"}, "builder/ci", false},
	}
	for _, tt := range tests {
		t.Run(tt.str, func(t *testing.T) {
			t.Parallel()
			if got := tt.id.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
			if got := tt.id.IsService(); got != tt.service {
				t.Errorf("IsService() = %v, want %v", got, tt.service)
			}
			if got, want := tt.id.URI().String(), "spiffe://td/"+tt.str; got != want {
				t.Errorf("URI() = %q, want %q", got, want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		td      string
		role    Role
		idName  string
		want    Identity
		wantErr string
	}{
		{name: "service fills its name", td: "td", role: RoleSigner, want: Identity{"td", RoleSigner, "signer"}},
		{name: "service named itself", td: "td", role: RoleCatalog, idName: "catalog", want: Identity{"td", RoleCatalog, "catalog"}},
		{name: "node", td: "td", role: RoleNode, idName: "ace", want: Identity{"td", RoleNode, "ace"}},
		{name: "service misnamed", td: "td", role: RoleSigner, idName: "other", wantErr: `service signer must be named "signer", not "other"`},
		{name: "node without name", td: "td", role: RoleNode, wantErr: `node name "" is not a DNS label`},
		{name: "unknown role", td: "td", role: "admin", idName: "x", wantErr: `unknown role "admin"`},
		{name: "bad trust domain", td: "TD", role: RoleNode, idName: "x", wantErr: "has characters outside"},
		{name: "empty trust domain", td: "", role: RoleNode, idName: "x", wantErr: "trust domain is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := New(tt.td, tt.role, tt.idName)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("New() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestFromCertificate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cert    *x509.Certificate
		want    Identity
		wantErr string
	}{
		{name: "one SAN", cert: &x509.Certificate{URIs: []*url.URL{mustURL(t, "spiffe://td/node/ace")}}, want: Identity{"td", RoleNode, "ace"}},
		{name: "nil", cert: nil, wantErr: "no certificate"},
		{name: "no SAN", cert: &x509.Certificate{}, wantErr: "certificate has no URI SAN"},
		{name: "two SANs", cert: &x509.Certificate{URIs: []*url.URL{mustURL(t, "spiffe://td/node/ace"), mustURL(t, "spiffe://td/node/bob")}}, wantErr: "certificate has 2 URI SANs, want exactly 1"},
		{name: "non-spiffe SAN", cert: &x509.Certificate{URIs: []*url.URL{mustURL(t, "https://td/node/ace")}}, wantErr: `certificate URI SAN "https://td/node/ace": scheme is "https"`},
		{name: "bad name", cert: &x509.Certificate{URIs: []*url.URL{mustURL(t, "spiffe://td/node/A")}}, wantErr: `node name "A" is not a DNS label`},
		{name: "CA", cert: &x509.Certificate{IsCA: true, URIs: []*url.URL{mustURL(t, "spiffe://td/node/ace")}}, wantErr: "certificate is a CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := FromCertificate(tt.cert)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromCertificate() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("FromCertificate() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// otherAuth is AuthInfo of a transport that is not TLS.
type otherAuth struct{}

func (otherAuth) AuthType() string { return "other" }

func TestFromPeer(t *testing.T) {
	t.Parallel()
	leaf := &x509.Certificate{URIs: []*url.URL{mustURL(t, "spiffe://td/operator/admin")}}
	tlsPeer := func(chains [][]*x509.Certificate) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{
			AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: chains}},
		})
	}
	tests := []struct {
		name    string
		ctx     context.Context
		want    Identity
		wantErr string
	}{
		{name: "verified", ctx: tlsPeer([][]*x509.Certificate{{leaf}}), want: Identity{"td", RoleOperator, "admin"}},
		{name: "no peer", ctx: context.Background(), wantErr: "no peer in context"},
		{name: "no auth", ctx: peer.NewContext(context.Background(), &peer.Peer{}), wantErr: "peer is not authenticated"},
		{name: "insecure", ctx: peer.NewContext(context.Background(), &peer.Peer{AuthInfo: otherAuth{}}), wantErr: "authenticated by other, not tls"},
		{name: "no verified chain", ctx: tlsPeer(nil), wantErr: "peer presented no verified certificate"},
		{name: "empty chain", ctx: tlsPeer([][]*x509.Certificate{{}}), wantErr: "peer presented no verified certificate"},
		{name: "bad SAN", ctx: tlsPeer([][]*x509.Certificate{{{}}}), wantErr: "certificate has no URI SAN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := FromPeer(tt.ctx)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromPeer() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("FromPeer() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestContext(t *testing.T) {
	t.Parallel()
	if _, ok := FromContext(context.Background()); ok {
		t.Fatal("FromContext of an empty context reported an identity")
	}
	id := Identity{"td", RoleNode, "ace"}
	got, ok := FromContext(NewContext(context.Background(), id))
	if !ok || got != id {
		t.Fatalf("FromContext() = %+v, %v; want %+v, true", got, ok, id)
	}
}
