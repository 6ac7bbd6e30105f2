package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/keyfile"
	"mesh.dev/internal/verify"
	signerv1 "mesh.dev/proto/mesh/signer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func init() { register(newKeysCmd) }

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Root keys and keysets (run root commands on an offline machine)",
	}
	cmd.AddCommand(newRootInitCmd(), newRootsCmd(), newSignKeysetCmd(), newShowKeysetCmd(), newServedKeysetCmd())
	return cmd
}

func newRootInitCmd() *cobra.Command {
	var dir, name string
	cmd := &cobra.Command{
		Use:   "root-init",
		Short: "Make a root key pair: <name>-key.pem (0600, keep offline) and <name>.pub.json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			priv, err := keyfile.Generate(filepath.Join(dir, name+"-key.pem"))
			if err != nil {
				return err
			}
			pub := priv.Public().(ed25519.PublicKey)
			root := &typev1.RootKey{Id: envelope.KeyID(pub), PublicKey: pub}
			if err := keyfile.WriteJSON(filepath.Join(dir, name+".pub.json"), root, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "root key %s: %s (private, keep offline), %s\n", root.GetId(),
				filepath.Join(dir, name+"-key.pem"), filepath.Join(dir, name+".pub.json"))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory to write into")
	cmd.Flags().StringVar(&name, "name", "root", "file name stem")
	return cmd
}

func newRootsCmd() *cobra.Command {
	var threshold uint32
	var out string
	cmd := &cobra.Command{
		Use:   "roots PUB.json...",
		Short: "Write the trust roots file engines pin: root public keys and how many must sign a keyset",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			roots := &typev1.TrustRoots{Threshold: threshold}
			for _, p := range args {
				k := &typev1.RootKey{}
				if err := keyfile.ReadJSON(p, k); err != nil {
					return err
				}
				roots.Keys = append(roots.Keys, k)
			}
			if err := verify.CheckRoots(roots); err != nil {
				return err
			}
			if err := keyfile.WriteJSON(out, roots, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "trust roots (%d of %d) written to %s\n", threshold, len(roots.Keys), out)
			return nil
		},
	}
	cmd.Flags().Uint32Var(&threshold, "threshold", 1, "root signatures a keyset needs")
	cmd.Flags().StringVar(&out, "out", "roots.json", "output file")
	return cmd
}

// parseKeyArg reads "FILE[=STATE]": a KeysetKey JSON (from mesh-signer init)
// and its state (active, retired, revoked; default active).
func parseKeyArg(arg string) (*typev1.KeysetKey, error) {
	path, state, _ := strings.Cut(arg, "=")
	k := &typev1.KeysetKey{}
	if err := keyfile.ReadJSON(path, k); err != nil {
		return nil, err
	}
	if len(k.GetPublicKey()) != ed25519.PublicKeySize || k.GetId() != envelope.KeyID(k.GetPublicKey()) {
		return nil, fmt.Errorf("%s: not a public key with its id", path)
	}
	st, err := parseState(state)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg, err)
	}
	k.State = st
	return k, nil
}

func parseState(s string) (typev1.KeyState, error) {
	switch strings.ToLower(s) {
	case "", "active":
		return typev1.KeyState_KEY_STATE_ACTIVE, nil
	case "retired":
		return typev1.KeyState_KEY_STATE_RETIRED, nil
	case "revoked":
		return typev1.KeyState_KEY_STATE_REVOKED, nil
	}
	return 0, fmt.Errorf("state %q is not active, retired or revoked", s)
}

func newSignKeysetCmd() *cobra.Command {
	var (
		from, out, rootsFile string
		version, floor       uint64
		expiresIn, keyValid  time.Duration
		keys, states, roots  []string
	)
	cmd := &cobra.Command{
		Use:   "sign-keyset",
		Short: "Sign a keyset listing the signer's online keys with t of the n root keys",
		Long: `Sign a keyset with root keys (on the offline machine that holds them).

A new keyset: --version 1 --key signer-key.pem.pub.json --root-key root-key.pem
Rotation: --from keyset.json --key new.pub.json --state OLDID=retired (then later
--from keyset.json --drop OLDID); the version goes up by one unless --version is given.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ks := &typev1.Keyset{}
			if from != "" {
				env := &typev1.Envelope{}
				if err := keyfile.ReadJSON(from, env); err != nil {
					return err
				}
				if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks); err != nil {
					return fmt.Errorf("%s: %w", from, err)
				}
				ks = proto.Clone(ks).(*typev1.Keyset)
				if version == 0 {
					version = ks.GetVersion() + 1
				}
			}
			if version == 0 {
				return errors.New("--version is required for a new keyset")
			}
			now := time.Now()
			ks.Version = version
			ks.IssuedAt = timestamppb.New(now)
			ks.ExpiresAt = timestamppb.New(now.Add(expiresIn))
			if floor > 0 {
				ks.RevisionFloor = floor
			}
			for _, arg := range keys {
				k, err := parseKeyArg(arg)
				if err != nil {
					return err
				}
				// Valid from the clock skew an engine is allowed before
				// now (DESIGN.md §7): an engine whose clock is behind by
				// less than that must not refuse what the new key signs.
				k.NotBefore = timestamppb.New(now.Add(-verify.Skew))
				k.NotAfter = timestamppb.New(now.Add(keyValid))
				replaced := false
				for i, old := range ks.Keys {
					if old.GetId() == k.GetId() {
						ks.Keys[i], replaced = k, true
					}
				}
				if !replaced {
					ks.Keys = append(ks.Keys, k)
				}
			}
			for _, arg := range states {
				id, state, ok := strings.Cut(arg, "=")
				st, err := parseState(state)
				if !ok || err != nil {
					return fmt.Errorf("--state %q: want KEYID=active|retired|revoked", arg)
				}
				found := false
				for _, k := range ks.Keys {
					if k.GetId() == id {
						k.State, found = st, true
					}
				}
				if !found {
					return fmt.Errorf("--state: no key %s in the keyset", id)
				}
			}
			drop, _ := cmd.Flags().GetStringSlice("drop")
			for _, id := range drop {
				kept := ks.Keys[:0]
				for _, k := range ks.Keys {
					if k.GetId() != id {
						kept = append(kept, k)
					}
				}
				if len(kept) == len(ks.Keys) {
					return fmt.Errorf("--drop: no key %s in the keyset", id)
				}
				ks.Keys = kept
			}
			if len(ks.Keys) == 0 {
				return errors.New("the keyset lists no key: give --key")
			}
			if len(roots) == 0 {
				return errors.New("--root-key is required (t of the n root keys)")
			}
			env, _, err := envelope.Seal(typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks)
			if err != nil {
				return err
			}
			for _, p := range roots {
				priv, err := keyfile.Load(p)
				if err != nil {
					return err
				}
				if err := envelope.SignWith(env, priv); err != nil {
					return err
				}
			}
			if rootsFile != "" {
				r, err := verify.LoadRoots(rootsFile)
				if err != nil {
					return err
				}
				if _, err := verify.Keyset(r, env); err != nil {
					return fmt.Errorf("the signed keyset does not verify against %s: %w", rootsFile, err)
				}
			}
			if err := keyfile.WriteJSON(out, env, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "keyset version %d (%d keys, %d root signatures) written to %s\n", ks.Version, len(ks.Keys), len(env.Signatures), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "start from this keyset file")
	f.StringVar(&out, "out", "keyset.json", "output file")
	f.StringVar(&rootsFile, "roots", "", "check the result against this trust roots file")
	f.Uint64Var(&version, "version", 0, "keyset version (default: --from's + 1)")
	f.Uint64Var(&floor, "revision-floor", 0, "manifests below this revision are refused")
	f.DurationVar(&expiresIn, "expires-in", 90*24*time.Hour, "keyset validity")
	f.DurationVar(&keyValid, "key-valid", 365*24*time.Hour, "validity of keys added by --key")
	f.StringSliceVar(&keys, "key", nil, "add a key: PUB.json[=active|retired|revoked] (repeatable)")
	f.StringSliceVar(&states, "state", nil, "set a listed key's state: KEYID=active|retired|revoked (repeatable)")
	f.StringSlice("drop", nil, "remove a key by id (repeatable)")
	f.StringSliceVar(&roots, "root-key", nil, "root private key file (repeatable)")
	return cmd
}

func newShowKeysetCmd() *cobra.Command {
	var rootsFile string
	cmd := &cobra.Command{
		Use:   "show KEYSET.json",
		Short: "Print a keyset, and verify it when --roots is given",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env := &typev1.Envelope{}
			if err := keyfile.ReadJSON(args[0], env); err != nil {
				return err
			}
			return showKeyset(cmd.OutOrStdout(), env, rootsFile, args[0])
		},
	}
	cmd.Flags().StringVar(&rootsFile, "roots", "", "trust roots file to verify against")
	return cmd
}

func newServedKeysetCmd() *cobra.Command {
	var rootsFile string
	cmd := &cobra.Command{
		Use:   "served",
		Short: "Print the keyset the signer at --signer serves and the key it signs with, verified when --roots is given",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cc, err := dial(conn.signer)
			if err != nil {
				return err
			}
			defer cc.Close()
			resp, err := signerv1.NewSignerServiceClient(cc).GetKeyset(cmd.Context(), &signerv1.GetKeysetRequest{})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "the signer at %s serves keyset version %d and signs with key %s\n", conn.signer, resp.GetVersion(), resp.GetSigningKeyId())
			return showKeyset(cmd.OutOrStdout(), resp.GetKeyset(), rootsFile, "the signer")
		},
	}
	cmd.Flags().StringVar(&rootsFile, "roots", "", "trust roots file to verify against")
	return cmd
}

// showKeyset prints a keyset envelope's keyset and, with a roots file,
// whether it verifies against it.
func showKeyset(w io.Writer, env *typev1.Envelope, rootsFile, from string) error {
	ks := &typev1.Keyset{}
	if err := envelope.Open(env, typev1.PayloadType_PAYLOAD_TYPE_KEYSET, ks); err != nil {
		return fmt.Errorf("keyset of %s: %w", from, err)
	}
	b, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(ks)
	fmt.Fprintln(w, string(b))
	if rootsFile == "" {
		return nil
	}
	r, err := verify.LoadRoots(rootsFile)
	if err != nil {
		return err
	}
	ring, err := verify.Keyset(r, env)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "verified against %s: version %d, expired %v\n", rootsFile, ring.Version(), ring.Expired(time.Now()))
	return nil
}
