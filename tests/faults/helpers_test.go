package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/envelope"
	"mesh.dev/internal/natsx"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

func cloneExpect(e Expect) Expect {
	out := Expect{}
	for k, v := range e {
		out[k] = v
	}
	return out
}

// changedCopy copies an example module with a line added at the top of one
// of its files (a new version of it).
func changedCopy(t *testing.T, module, rel, line string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), module)
	must(t, os.CopyFS(dst, os.DirFS(moduleDir(module))))
	file := filepath.Join(dst, rel)
	b, err := os.ReadFile(file)
	must(t, err)
	must(t, os.WriteFile(file, append([]byte(line), b...), 0o644))
	return dst
}

// leaseHolder2 waits until a composer other than old holds the lease.
func (r *run) leaseHolder2(old *Service) *Service {
	r.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if h := r.leaseHolder(); h != old {
			return h
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no composer but %s took the lease", old.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// composedFor waits until node's assignment wants each module at the
// fingerprint r.expect holds for it (the composer composed the change and
// committed it) and returns that assignment.
func (r *run) composedFor(node string, modules ...string) *composerv1.Assignment {
	r.t.Helper()
	var a *composerv1.Assignment
	r.waitFor("the composer composed the change for "+node, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, _, err := r.m.Assignment(ctx, node)
		if err != nil {
			return err
		}
		for _, m := range modules {
			if wantOf(got, m).GetFingerprint() != r.expect[m] {
				return fmt.Errorf("%s's assignment does not want the new %s yet", node, m)
			}
		}
		a = got
		return nil
	})
	return a
}

// wantOf is an assignment's want of module, nil when it has none.
func wantOf(a *composerv1.Assignment, module string) *typev1.Want {
	for _, w := range a.GetWants() {
		if w.GetModule() == module {
			return w
		}
	}
	return nil
}

// waitSignedBy waits until every node's current manifest and every
// composition it names are signed by key id (and only by it).
func (r *run) waitSignedBy(id string) {
	r.t.Helper()
	r.waitFor("everything signed by "+id, ConvergeBound, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		kv, err := r.m.JS.KeyValue(ctx, natsx.BucketCompositions)
		if err != nil {
			return err
		}
		for _, e := range r.m.Engines {
			a, _, err := r.m.Assignment(ctx, e.Node)
			if err != nil {
				return err
			}
			if err := signedOnlyBy(a.GetManifest(), id); err != nil {
				return fmt.Errorf("%s's manifest: %w", e.Node, err)
			}
			for _, w := range a.GetWants() {
				ce, err := kv.Get(ctx, w.GetCompositionKey())
				if err != nil {
					return err
				}
				env := &typev1.Envelope{}
				if err := proto.Unmarshal(ce.Value(), env); err != nil {
					return err
				}
				if err := signedOnlyBy(env, id); err != nil {
					return fmt.Errorf("%s: %w", w.GetCompositionKey(), err)
				}
			}
		}
		return r.m.Converged(r.expect)
	})
}

func signedOnlyBy(env *typev1.Envelope, id string) error {
	for _, s := range env.GetSignatures() {
		if s.GetKeyId() != id {
			return fmt.Errorf("signed by %s", s.GetKeyId())
		}
	}
	if len(env.GetSignatures()) == 0 {
		return fmt.Errorf("not signed")
	}
	return nil
}

// waitKeysetTaken waits until every engine holds keyset version v.
func (r *run) waitKeysetTaken(v uint64) {
	r.t.Helper()
	r.waitKeysetTakenBy(v)
}

// waitKeysetTakenBy waits until the engines of nodes (every engine when
// none) hold keyset version v.
func (r *run) waitKeysetTakenBy(v uint64, nodes ...string) {
	r.t.Helper()
	engines := r.m.Engines
	if len(nodes) > 0 {
		engines = nil
		for _, n := range nodes {
			engines = append(engines, r.m.Engine(n))
		}
	}
	r.waitFor(fmt.Sprintf("engines hold keyset version %d", v), ConvergeBound, func() error {
		for _, e := range engines {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := e.Status(ctx)
			cancel()
			if err != nil {
				return err
			}
			if st.GetKeysetVersion() != v {
				return fmt.Errorf("%s holds keyset version %d", e.Node, st.GetKeysetVersion())
			}
		}
		return nil
	})
}

// rawAssignment returns the stored bytes of a node's assignment.
func (r *run) rawAssignment(ctx context.Context, node string) []byte {
	r.t.Helper()
	kv, err := r.m.JS.KeyValue(ctx, natsx.BucketAssignments)
	must(r.t, err)
	e, err := kv.Get(ctx, node)
	must(r.t, err)
	return bytes.Clone(e.Value())
}

// rawWantedComposition returns the stored bytes of the composition a node's
// assignment names for a module.
func (r *run) rawWantedComposition(ctx context.Context, node, module string) []byte {
	r.t.Helper()
	a, _, err := r.m.Assignment(ctx, node)
	must(r.t, err)
	kv, err := r.m.JS.KeyValue(ctx, natsx.BucketCompositions)
	must(r.t, err)
	for _, w := range a.GetWants() {
		if w.GetModule() == module {
			e, err := kv.Get(ctx, w.GetCompositionKey())
			must(r.t, err)
			return bytes.Clone(e.Value())
		}
	}
	r.t.Fatalf("%s wants no %s", node, module)
	return nil
}

// putRaw writes bytes straight into a key, no CAS: what someone with write
// access to NATS and no key can do.
func (r *run) putRaw(ctx context.Context, bucket, key string, value []byte) {
	r.t.Helper()
	kv, err := r.m.JS.KeyValue(ctx, bucket)
	must(r.t, err)
	_, err = kv.Put(ctx, key, value)
	must(r.t, err)
}

// newObjectOf returns an object the current composition of a module of a
// node names that the engine has not applied yet.
func (r *run) newObjectOf(ctx context.Context, node, module string) (string, error) {
	a, _, err := r.m.Assignment(ctx, node)
	if err != nil {
		return "", err
	}
	_, applied := r.m.Rec.Applied(node)
	kv, err := r.m.JS.KeyValue(ctx, natsx.BucketCompositions)
	if err != nil {
		return "", err
	}
	for _, w := range a.GetWants() {
		if w.GetModule() != module || applied[module] == w.GetCompositionDigest() {
			continue
		}
		e, err := kv.Get(ctx, w.GetCompositionKey())
		if err != nil {
			return "", err
		}
		_, c, err := decodeComposition(e)
		if err != nil {
			return "", err
		}
		for _, res := range c.GetResources() {
			if d := res.GetObject().GetDigest(); d != "" {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("%s's current %s composition names no object it has not applied", node, module)
}

// staleSigned reads the signer's audit log and returns every signed record
// whose fencing epoch is below a fence the signer recorded before it: a
// sign request of a replica that no longer held the lease, signed anyway.
// It also returns how many refusals name a stale fencing epoch.
func (r *run) staleSigned() (stale []string, refusals int) {
	r.t.Helper()
	f, err := os.Open(filepath.Join(r.m.Dir, "signer", "state", "audit.log"))
	must(r.t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	var fenced uint64
	for sc.Scan() {
		var rec struct {
			Seq    uint64 `json:"seq"`
			Kind   string `json:"kind"`
			Method string `json:"method"`
			Epoch  uint64 `json:"epoch"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		switch rec.Kind {
		case "fence":
			fenced = max(fenced, rec.Epoch)
		case "signed":
			if rec.Epoch < fenced {
				stale = append(stale, fmt.Sprintf("seq %d: %s signed in epoch %d after epoch %d was fenced in", rec.Seq, rec.Method, rec.Epoch, fenced))
			}
		case "refused":
			if strings.Contains(rec.Reason, "fencing epoch") && strings.Contains(rec.Reason, "below") {
				refusals++
			}
		}
	}
	must(r.t, sc.Err())
	return stale, refusals
}

// forgeManifest writes into a node's assignment, raw, its current manifest
// changed by edit (revision one up, issued now, unless edit says otherwise)
// and signed by key: what the holder of a key the keyset no longer trusts,
// with write access to NATS, can do. It returns the forged revision.
func (r *run) forgeManifest(ctx context.Context, node string, key ed25519.PrivateKey, edit func(m *typev1.Manifest)) uint64 {
	r.t.Helper()
	a, _, err := r.m.Assignment(ctx, node)
	must(r.t, err)
	m := &typev1.Manifest{}
	must(r.t, proto.Unmarshal(a.GetManifest().GetPayload(), m))
	m.Revision = a.GetManifestRevision() + 1
	m.IssuedAt = timestamppb.Now()
	if edit != nil {
		edit(m)
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	must(r.t, err)
	input, err := envelope.SigningInput(typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, payload)
	must(r.t, err)
	env := &typev1.Envelope{PayloadType: typev1.PayloadType_PAYLOAD_TYPE_MANIFEST, Payload: payload,
		Signatures: []*typev1.Signature{{KeyId: KeyID(key), Signature: ed25519.Sign(key, input)}}}
	a.Manifest, a.ManifestRevision, a.ManifestDigest = env, m.GetRevision(), envelope.Digest(env)
	b, err := proto.Marshal(a)
	must(r.t, err)
	r.putRaw(ctx, natsx.BucketAssignments, node, b)
	return m.GetRevision()
}

// waitRefused waits until node's engine reported a FAILED or STALE attempt
// with code since from, and returns it.
func (r *run) waitRefused(node string, from time.Time, code composerv1.ReasonCode) Failure {
	r.t.Helper()
	var got Failure
	r.waitFor(fmt.Sprintf("%s reports %v", node, code), 20*time.Second, func() error {
		var seen []string
		for _, f := range r.m.Rec.RefusedSince(from) {
			if f.Node == node && f.Code == code {
				got = f
				return nil
			}
			seen = append(seen, f.String())
		}
		return fmt.Errorf("%s reported no %v (saw %v)", node, code, seen)
	})
	return got
}
