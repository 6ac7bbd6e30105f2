package testutil

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

// NATSAuth says how a server of StartTLSJetStream lets clients in. Exactly
// one of its fields is set.
type NATSAuth struct {
	// CertUsers: every client presents a certificate of the PKI and logs in
	// as the user its URI SAN names (verify_and_map, as deploy/nats does);
	// these identities are the users, with every permission.
	CertUsers []identity.Identity
	// Passwords: users and their passwords.
	Passwords map[string]string
	// Creds runs the server in operator mode with one account holding
	// JetStream; TLSJetStream.CredsFile issues a user's .creds file.
	Creds bool
}

// TLSJetStream is a real nats-server with JetStream that clients reach over
// TLS 1.3 only, with a certificate of the PKI (DNS localhost, IP 127.0.0.1,
// no mesh identity: a NATS server is none).
type TLSJetStream struct {
	// URL is tls://127.0.0.1:<port>.
	URL string
	// CAFile verifies the server: the PKI's CA.
	CAFile string
	Server *server.Server

	account nkeys.KeyPair
	dir     string
}

// StartTLSJetStream starts the server in t.TempDir() and shuts it down when
// the test ends.
func StartTLSJetStream(t testing.TB, p *PKI, auth NATSAuth) *TLSJetStream {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM := p.Issue(t, identity.Identity{}, pki.IssueOptions{
		URIs: []*url.URL{}, NoDefaultSANs: true,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err := pki.WriteIssued(dir, "nats-server", certPEM, keyPEM); err != nil {
		t.Fatalf("testutil: write nats server certificate: %v", err)
	}
	certFile, keyFile := pki.Paths(dir, "nats-server")
	tlsCfg, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: certFile, KeyFile: keyFile, CaFile: p.CAFile(),
		Verify: len(auth.CertUsers) > 0, Map: len(auth.CertUsers) > 0, MinVersion: 0x0304, // TLS 1.3
	})
	if err != nil {
		t.Fatalf("testutil: nats server tls: %v", err)
	}
	opts := &server.Options{
		ServerName: "tls-test", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: filepath.Join(dir, "data"), JetStreamMaxMemory: -1, JetStreamMaxStore: -1,
		TLS: true, TLSConfig: tlsCfg, TLSTimeout: 5, TLSVerify: len(auth.CertUsers) > 0, TLSMap: len(auth.CertUsers) > 0,
		NoSigs: true, NoLog: true,
	}
	s := &TLSJetStream{CAFile: p.CAFile(), dir: dir}
	for _, id := range auth.CertUsers {
		opts.Users = append(opts.Users, &server.User{Username: id.URI().String()})
	}
	for user, password := range auth.Passwords {
		opts.Users = append(opts.Users, &server.User{Username: user, Password: password})
	}
	if auth.Creds {
		s.account = operatorMode(t, opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testutil: nats server: %v", err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("testutil: tls nats server not ready within 10s")
	}
	s.Server = srv
	s.URL = "tls://" + srv.Addr().String()
	return s
}

// operatorMode makes opts trust a new operator whose one account holds
// JetStream, kept in a memory resolver, and returns the account's key.
func operatorMode(t testing.TB, opts *server.Options) nkeys.KeyPair {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("testutil: operator mode: %v", err)
		}
	}
	operator, err := nkeys.CreateOperator()
	must(err)
	operatorPub, err := operator.PublicKey()
	must(err)
	oc := jwt.NewOperatorClaims(operatorPub)
	operatorJWT, err := oc.Encode(operator)
	must(err)
	oc, err = jwt.DecodeOperatorClaims(operatorJWT)
	must(err)

	account, err := nkeys.CreateAccount()
	must(err)
	accountPub, err := account.PublicKey()
	must(err)
	ac := jwt.NewAccountClaims(accountPub)
	ac.Name = "mesh"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accountJWT, err := ac.Encode(operator)
	must(err)

	// JetStream in operator mode needs a system account.
	system, err := nkeys.CreateAccount()
	must(err)
	systemPub, err := system.PublicKey()
	must(err)
	sc := jwt.NewAccountClaims(systemPub)
	sc.Name = "SYS"
	systemJWT, err := sc.Encode(operator)
	must(err)

	resolver := &server.MemAccResolver{}
	must(resolver.Store(accountPub, accountJWT))
	must(resolver.Store(systemPub, systemJWT))
	opts.TrustedOperators = []*jwt.OperatorClaims{oc}
	opts.AccountResolver = resolver
	opts.SystemAccount = systemPub
	return account
}

// CredsFile writes the .creds file (user JWT and seed) of a new user of the
// server's account and returns its path; the server must run with Creds.
func (s *TLSJetStream) CredsFile(t testing.TB, name string) string {
	t.Helper()
	if s.account == nil {
		t.Fatal("testutil: CredsFile of a server without NATSAuth.Creds")
	}
	return writeCreds(t, s.dir, name, s.account)
}

// ForeignCredsFile writes a .creds file of a user of an account the server
// does not know.
func (s *TLSJetStream) ForeignCredsFile(t testing.TB, name string) string {
	t.Helper()
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	return writeCreds(t, s.dir, name, account)
}

func writeCreds(t testing.TB, dir, name string, account nkeys.KeyPair) string {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	userPub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	userJWT, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
