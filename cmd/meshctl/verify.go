package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/verify"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func init() { register(newVerifyCmd) }

// readEnvelope reads an envelope from protojson (as grpcurl and meshctl -o
// json print it, bare or under a "manifest"/"composition"/"keyset" field)
// or from binary protobuf.
func readEnvelope(path string) (*typev1.Envelope, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := &typev1.Envelope{}
	if s := strings.TrimSpace(string(b)); strings.HasPrefix(s, "{") {
		if err := (protojson.UnmarshalOptions{}).Unmarshal(b, env); err == nil {
			return env, nil
		}
		// A response wrapping the envelope: take its one envelope field.
		for _, field := range []string{"manifest", "composition", "keyset"} {
			if i := strings.Index(s, `"`+field+`"`); i >= 0 {
				inner, ok := objectAfter(s[i+len(field)+2:])
				if ok && (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal([]byte(inner), env) == nil {
					return env, nil
				}
			}
		}
		return nil, fmt.Errorf("%s: not an envelope (protojson)", path)
	}
	if err := proto.Unmarshal(b, env); err != nil {
		return nil, fmt.Errorf("%s: not an envelope: %w", path, err)
	}
	return env, nil
}

// objectAfter returns the JSON object that follows a ':' in s.
func objectAfter(s string) (string, bool) {
	i := strings.IndexByte(s, '{')
	if i < 0 || strings.TrimSpace(s[:i]) != ":" {
		return "", false
	}
	depth, inStr, esc := 0, false, false
	for j := i; j < len(s); j++ {
		c := s[j]
		switch {
		case esc:
			esc = false
		case c == '\\' && inStr:
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return s[i : j+1], true
			}
		}
	}
	return "", false
}

func newVerifyCmd() *cobra.Command {
	var rootsFile, keysetFile, manifestFile, node string
	var at string
	cmd := &cobra.Command{
		Use:   "verify FILE...",
		Short: "Verify keysets, manifests and compositions offline against pinned roots",
		Long: `verify checks signed envelopes (protojson as grpcurl prints them, or binary) the
way a node engine does, without any service: a keyset against the roots; a
manifest against the roots and the keyset (signature, node, expiry with 1 h skew,
issue time, revision floor, wants); a composition against the roots, the keyset
and the manifest whose want names it (digest, signature, node, module and
fingerprint, lint). It prints what each file is and exits non-zero if any fails.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			roots, err := verify.LoadRoots(rootsFile)
			if err != nil {
				return err
			}
			now := time.Now()
			if at != "" {
				if now, err = time.Parse(time.RFC3339, at); err != nil {
					return fmt.Errorf("--at: %w", err)
				}
			}
			var ring *verify.Keyring
			if keysetFile != "" {
				env, err := readEnvelope(keysetFile)
				if err != nil {
					return err
				}
				if ring, err = verify.Keyset(roots, env); err != nil {
					return fmt.Errorf("%s: %w", keysetFile, err)
				}
			}
			var manifest *typev1.Manifest
			if manifestFile != "" {
				if ring == nil {
					return errors.New("--manifest needs --keyset")
				}
				env, err := readEnvelope(manifestFile)
				if err != nil {
					return err
				}
				n := node
				if n == "" {
					m := &typev1.Manifest{}
					if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
						return fmt.Errorf("%s: %w", manifestFile, err)
					}
					n = m.GetNode()
				}
				if manifest, _, err = ring.Manifest(env, n, now); err != nil {
					return fmt.Errorf("%s: %w", manifestFile, err)
				}
			}
			failed := 0
			for _, f := range args {
				what, err := verifyOne(f, roots, ring, manifest, node, now)
				if err != nil {
					failed++
					fmt.Fprintf(out, "FAIL %s: %v\n", f, err)
					continue
				}
				fmt.Fprintf(out, "ok   %s: %s\n", f, what)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d files failed verification", failed, len(args))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&rootsFile, "roots", "roots.json", "pinned trust roots")
	f.StringVar(&keysetFile, "keyset", "", "root-signed keyset (needed for manifests and compositions)")
	f.StringVar(&manifestFile, "manifest", "", "the manifest whose wants name the compositions")
	f.StringVar(&node, "node", "", "the node the manifest must be for (default: the manifest's)")
	f.StringVar(&at, "at", "", "judge times as of this RFC 3339 time (default now)")
	return cmd
}

func verifyOne(path string, roots *typev1.TrustRoots, ring *verify.Keyring, manifest *typev1.Manifest, node string, now time.Time) (string, error) {
	env, err := readEnvelope(path)
	if err != nil {
		return "", err
	}
	switch env.GetPayloadType() {
	case typev1.PayloadType_PAYLOAD_TYPE_KEYSET:
		r, err := verify.Keyset(roots, env)
		if err != nil {
			return "", err
		}
		state := "valid"
		if r.Expired(now) {
			state = "EXPIRED"
		}
		return fmt.Sprintf("keyset version %d, %d keys, %s", r.Version(), len(r.Keyset().GetKeys()), state), nil
	case typev1.PayloadType_PAYLOAD_TYPE_MANIFEST:
		if ring == nil {
			return "", errors.New("a manifest needs --keyset")
		}
		n := node
		if n == "" {
			m := &typev1.Manifest{}
			if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, m); err != nil {
				return "", err
			}
			n = m.GetNode()
		}
		m, digest, err := ring.Manifest(env, n, now)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("manifest of %s, revision %d, %d wants, expires %s, digest %s", m.GetNode(), m.GetRevision(), len(m.GetWants()),
			m.GetExpiresAt().AsTime().UTC().Format(time.RFC3339), digest), nil
	case typev1.PayloadType_PAYLOAD_TYPE_COMPOSITION:
		if ring == nil || manifest == nil {
			return "", errors.New("a composition needs --keyset and --manifest (its want gives the digest)")
		}
		digest := envelope.Digest(env)
		var want *typev1.Want
		for _, w := range manifest.GetWants() {
			if w.GetCompositionDigest() == digest {
				want = w
			}
		}
		if want == nil {
			return "", fmt.Errorf("no want of the manifest (revision %d) names digest %s", manifest.GetRevision(), digest)
		}
		c, err := ring.Composition(env, manifest.GetNode(), want, now)
		if err != nil {
			return "", err
		}
		if err := lint.CheckComposition(c); err != nil {
			return "", err
		}
		return fmt.Sprintf("composition %s, %d resources", want.GetCompositionKey(), len(c.GetResources())), nil
	}
	return "", fmt.Errorf("payload type %v is not a keyset, manifest or composition", env.GetPayloadType())
}
