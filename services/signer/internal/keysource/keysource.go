// Package keysource keeps the signer's online ed25519 private key behind a
// small interface: the rest of the signer can sign a signing input and learn
// the public key and its id, and nothing else. A file backend serves
// production; a memory backend serves tests.
package keysource

import (
	"context"
	"crypto/ed25519"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/keyfile"
)

// Source signs with one private key it never hands out.
type Source interface {
	// Public returns the public key.
	Public() ed25519.PublicKey
	// KeyID returns the key's id as keysets list it.
	KeyID() string
	// Sign returns the ed25519 signature of input (a signing input built
	// by envelope.SigningInput, never raw caller bytes).
	Sign(ctx context.Context, input []byte) ([]byte, error)
}

type memory struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
	id   string
}

// Memory returns a Source over a key held in memory.
func Memory(priv ed25519.PrivateKey) Source {
	pub := priv.Public().(ed25519.PublicKey)
	return &memory{priv: priv, pub: pub, id: envelope.KeyID(pub)}
}

func (m *memory) Public() ed25519.PublicKey { return m.pub }
func (m *memory) KeyID() string             { return m.id }
func (m *memory) Sign(_ context.Context, input []byte) ([]byte, error) {
	return ed25519.Sign(m.priv, input), nil
}

// File returns a Source over a PKCS#8 PEM key file, refusing a file group or
// others can read. The key is read once, at start.
func File(path string) (Source, error) {
	priv, err := keyfile.Load(path)
	if err != nil {
		return nil, err
	}
	return Memory(priv), nil
}

// Init generates a new key file for the signer (mode 0600, never
// overwriting) and returns its Source.
func Init(path string) (Source, error) {
	priv, err := keyfile.Generate(path)
	if err != nil {
		return nil, err
	}
	return Memory(priv), nil
}
