package app_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/types/known/structpb"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/envelope"
	"mesh.dev/internal/identity"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	ct "mesh.dev/services/composer/internal/composertest"
	"mesh.dev/services/composer/internal/objects"
)

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

func inline(id, path string, content []byte) *typev1.Resource {
	return &typev1.Resource{Id: id, Type: ct.File, Path: path, Mode: 0o644, Content: &typev1.Resource_Inline{Inline: content}}
}

// TestObjects covers DESIGN.md §5.2 step 1: inline content over 64 KiB goes
// to the object store, then the largest inline files until the encoded
// composition is at most 256 KiB; every object a composition names is held
// before it is written, and a node reads it through GetObject.
func TestObjects(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	big := fill(lint.MaxInlineContent+1, 'b')
	// 5 files under the inline limit, 290 KiB together: the two largest
	// must go for the rest to fit in 256 KiB.
	spec := ct.Spec("ace")
	spec.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big)}
	for i, kib := range []int{60, 59, 58, 57, 56} {
		spec.Resources = append(spec.Resources, inline(fmt.Sprintf("local:f%d", i), fmt.Sprintf("/etc/f%d", i), fill(kib<<10, byte('0'+i))))
	}
	c.PutNode(t, spec)
	res := c.Pass(t, "ace")
	if res.Err != nil || !res.Committed {
		t.Fatalf("pass: %v", res.Err)
	}
	a, _, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	comp, err := w.Composition(t, "ace", ct.Want(a, names.NodeModule))
	ct.Must(t, err)
	if n := canonical.Size(comp); n > lint.MaxCompositionSize {
		t.Errorf("composition is %d bytes encoded", n)
	}
	content := map[string][]byte{"/etc/big": big}
	for i, r := range spec.Resources[1:] {
		content[fmt.Sprintf("/etc/f%d", i)] = r.GetInline()
	}
	var moved []string
	for _, r := range comp.GetResources() {
		if o := r.GetObject(); o != nil {
			moved = append(moved, r.GetPath())
			if o.GetDigest() != names.Digest(content[r.GetPath()]) || o.GetSize() != int64(len(content[r.GetPath()])) {
				t.Errorf("%s names object %v", r.GetPath(), o)
			}
			// A node reads it through GetObject, its own composition
			// naming the digest.
			got := getObject(t, w, c, "ace", "ace.node", o.GetDigest())
			if !bytes.Equal(got, content[r.GetPath()]) {
				t.Errorf("GetObject %s returned %d bytes", r.GetPath(), len(got))
			}
		} else if !bytes.Equal(r.GetInline(), content[r.GetPath()]) {
			t.Errorf("%s inline content changed", r.GetPath())
		}
	}
	if want := []string{"/etc/big", "/etc/f0"}; !slices.Equal(moved, want) {
		t.Errorf("moved to the object store: %v, want %v", moved, want)
	}

	// A file over 64 KiB moves even when the composition would fit; one
	// of exactly 64 KiB is not over the limit and stays inline.
	alone := ct.Spec("bob")
	exact := fill(lint.MaxInlineContent, 'e')
	alone.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big), inline("local:exact", "/etc/exact", exact)}
	c.PutNode(t, alone)
	if res := c.Pass(t, "bob"); res.Err != nil {
		t.Fatal(res.Err)
	}
	b, _, err := w.Assignment(t, "bob")
	ct.Must(t, err)
	comp, err = w.Composition(t, "bob", ct.Want(b, names.NodeModule))
	ct.Must(t, err)
	if o := comp.GetResources()[0].GetObject(); o.GetDigest() != names.Digest(big) {
		t.Errorf("a %d-byte file stayed inline", len(big))
	}
	if r := comp.GetResources()[1]; r.GetObject() != nil || !bytes.Equal(r.GetInline(), exact) {
		t.Errorf("a file of exactly %d bytes (not over the limit) left the composition: %v", len(exact), r.GetObject())
	}
}

func getObject(t testing.TB, w *ct.World, c *ct.Composer, node, key, digest string) []byte {
	t.Helper()
	client := composerv1.NewComposerServiceClient(w.As(t, c.Addr, identity.RoleNode, node))
	stream, err := client.GetObject(context.Background(), &composerv1.GetObjectRequest{CompositionKey: key, Digest: digest})
	ct.Must(t, err)
	var out []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		ct.Must(t, err)
		out = append(out, msg.GetChunk()...)
	}
}

// TestObjectsNotHeld covers the held check of DESIGN.md §5.2 step 1 and the
// order of step 6: a composition naming an object that is not held is
// refused with its words; the node's own is then not written, other modules
// still are, and the failed pass commits no assignment.
func TestObjectsNotHeld(t *testing.T) {
	t.Parallel()
	t.Run("an own resource naming an object nobody put", func(t *testing.T) {
		t.Parallel()
		w := ct.New(t)
		c := w.StartManual(t, "one")
		digest := names.Digest([]byte("never put"))
		spec := ct.Spec("ace")
		spec.Resources = []*typev1.Resource{{Id: "local:blob", Type: ct.File, Path: "/etc/blob", Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: digest, Size: 9}}}}
		c.PutNode(t, spec)
		rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketAssignments)
		res := c.Pass(t, "ace")
		want := "ace.node: resource local:blob: object " + digest + " of node ace is not held (the object store holds no such object); not written"
		if res.Err == nil || res.Err.Error() != want {
			t.Fatalf("pass error:\n%v\nwant:\n%s", res.Err, want)
		}
		if got := rec.All(); len(got) != 0 {
			t.Errorf("wrote %v", got)
		}
	})
	t.Run("an own resource naming a held object at another size", func(t *testing.T) {
		t.Parallel()
		w := ct.New(t)
		c := w.StartManual(t, "one")
		blob := []byte("held bytes")
		digest := names.Digest(blob)
		corrupt(t, w, digest, blob) // the very bytes of the digest, put by another writer
		spec := ct.Spec("ace")
		spec.Resources = []*typev1.Resource{{Id: "local:blob", Type: ct.File, Path: "/etc/blob", Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: digest, Size: int64(len(blob)) + 1}}}}
		c.PutNode(t, spec)
		rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketAssignments)
		res := c.Pass(t, "ace")
		want := fmt.Sprintf("ace.node: resource local:blob: object %s of node ace is not held (the object store holds %d bytes, the resource says %d); not written", digest, len(blob), len(blob)+1)
		if res.Err == nil || res.Err.Error() != want {
			t.Fatalf("pass error:\n%v\nwant:\n%s", res.Err, want)
		}
		if got := rec.All(); len(got) != 0 {
			t.Errorf("wrote %v", got)
		}
	})
	t.Run("the object store unusable", func(t *testing.T) {
		t.Parallel()
		w := ct.New(t)
		c := w.StartManual(t, "one")
		bigMod := &typev1.ModuleManifest{Module: "big", Version: "1.0", Upgrade: ct.Auto, Resources: []*typev1.ResourceTemplate{
			{Name: "blob", Type: ct.File, Path: "/opt/big/blob", Content: &typev1.ResourceTemplate_Raw{Raw: fill(lint.MaxInlineContent+1, 'x')}},
		}}
		w.Release(t, bigMod, nil)
		motdFP := w.Release(t, ct.Motd("1.0"), nil)
		waitRegistered(t, c, "big", "motd")
		c.PutNode(t, ct.Spec("ace", "big", "motd"))
		ct.Must(t, w.JS.DeleteObjectStore(context.Background(), natsx.ObjectStoreObjects))
		rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments)
		res := c.Pass(t, "ace")
		if res.Err == nil {
			t.Fatal("the pass succeeded")
		}
		msg := res.Err.Error()
		digest := names.Digest(fill(lint.MaxInlineContent+1, 'x'))
		for _, want := range []string{
			"resource big:blob: object " + digest + " of node ace is not held (",
			"); not written",
			"ace.node is not written: a module's composition of this pass was not",
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q does not say %q", msg, want)
			}
		}
		if !strings.HasPrefix(msg, "ace.big.") {
			t.Errorf("the refusal does not start with the key: %q", msg)
		}
		var keys []string
		for _, wr := range rec.All() {
			keys = append(keys, wr.Bucket+"/"+wr.Key)
		}
		motdKey := "ace.motd." + names.FingerprintHex(motdFP)
		if !slices.Equal(keys, []string{"compositions/" + motdKey, "composed/" + motdKey}) {
			t.Errorf("wrote %v; want only motd's composition and record (modules still written, own not, no assignment)", keys)
		}
	})
}

func waitRegistered(t testing.TB, c *ct.Composer, modules ...string) {
	t.Helper()
	ct.WaitFor(t, "registrations seen", 10*time.Second, func() (bool, string) {
		for _, m := range modules {
			if _, ok := c.View.Registration(m); !ok {
				return false, m + " not yet"
			}
		}
		return true, ""
	})
}

// waitFingerprint waits until the composer's catalog view holds a module at
// a fingerprint.
func waitFingerprint(t testing.TB, c *ct.Composer, module, fp string) {
	t.Helper()
	ct.WaitFor(t, module+" registered", 10*time.Second, func() (bool, string) {
		r, ok := c.View.Registration(module)
		return ok && r.GetFingerprint() == fp, "not yet"
	})
}

// TestCompare covers DESIGN.md §5.2 steps 2 and 5: a value that does not
// decode or verify counts as present with no content and is replaced by an
// Update at its revision; a digest equal to the new one is neither signed
// nor written, but its judgement record is still recomputed.
func TestCompare(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	motdFP := w.Release(t, ct.Motd("1.0"), nil)
	waitRegistered(t, c, "motd")
	c.PutNode(t, ct.Spec("ace", "motd"))
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	key := "ace.motd." + names.FingerprintHex(motdFP)
	asg0, asgRev, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	comps := w.KV(t, natsx.BucketCompositions)
	good, err := comps.Get(context.Background(), key)
	ct.Must(t, err)
	audit := auditLines(t, w)

	otherKey := testutil.NewKey(t)
	forged := &typev1.Envelope{}
	ct.Must(t, protoUnmarshal(good.Value, forged))
	forged.Signatures = nil
	ct.Must(t, envelope.SignWith(forged, otherKey))
	cases := []struct {
		name  string
		value []byte
	}{
		{"bytes that do not decode", []byte("\xff\xff not a protobuf")},
		{"an envelope signed by a key the keyset does not list", mustMarshal(t, forged)},
		{"an envelope of another payload", mustMarshal(t, asg0.GetManifest())},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			corruptRev, err := comps.Put(context.Background(), key, tc.value)
			ct.Must(t, err)
			rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments)
			res := c.Pass(t, "ace")
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			got := rec.All()
			if len(got) != 1 || got[0].Key != key || got[0].Bucket != natsx.BucketCompositions || got[0].Expected != fmt.Sprint(corruptRev) {
				t.Fatalf("writes %v; want one Update of %s at revision %d", got, key, corruptRev)
			}
			now, err := comps.Get(context.Background(), key)
			ct.Must(t, err)
			if !bytes.Equal(now.Value, good.Value) {
				t.Error("the repaired value differs from the one signed before")
			}
			if _, err := w.CheckAssignment(t, asg0); err != nil {
				t.Error(err)
			}
		})
	}
	if _, rev, _ := w.Assignment(t, "ace"); rev != asgRev {
		t.Errorf("repairs rewrote the assignment (r%d → r%d)", asgRev, rev)
	}

	t.Run("digest equal: only the judgement record is recomputed", func(t *testing.T) {
		signed := len(auditLines(t, w))
		for _, tamper := range []func(){
			func() { ct.Must(t, w.KV(t, natsx.BucketComposed).Delete(context.Background(), key)) },
			func() {
				w.Put(t, natsx.BucketComposed, key, &composerv1.JudgementRecord{Digest: "sha256:" + strings.Repeat("0", 64), Words: "stale"})
			},
		} {
			tamper()
			rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed, natsx.BucketAssignments)
			res := c.Pass(t, "ace")
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			got := rec.All()
			if len(got) != 1 || got[0].Bucket != natsx.BucketComposed || got[0].Key != key || got[0].Expected == "" {
				t.Fatalf("writes %v; want only the judgement record of %s, by CAS", got, key)
			}
			r := &composerv1.JudgementRecord{}
			_, err := w.Get(t, natsx.BucketComposed, key, r)
			ct.Must(t, err)
			if r.GetDigest() != ct.Want(asg0, "motd").GetCompositionDigest() || r.GetJudgement() != composerv1.Judgement_JUDGEMENT_NEW {
				t.Errorf("record %v", r)
			}
		}
		if n := len(auditLines(t, w)); n != signed {
			t.Errorf("the signer was asked %d more times for a digest already held", n-signed)
		}
	})
	_ = audit
}

// TestCommitPoint covers DESIGN.md §5.2 step 7: one CAS of the assignment
// per node per pass (Create first, then Update at the revision read), and
// only when every composition the wants name is held: a held move whose
// wanted composition was lost and cannot be rebuilt to the same digest
// drops the want and says so (TestHeldCompositionRebuilt covers the rebuild).
func TestCommitPoint(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	v1 := w.Release(t, ct.SSHD("1.0", ""), nil)
	waitFingerprint(t, c, "sshd", v1)
	spec := ct.Spec("ace", "sshd")
	c.PutNode(t, spec)
	rec := w.RecordWrites(t, natsx.BucketAssignments)
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatal(res.Err)
	}
	_, rev1, err := w.Assignment(t, "ace")
	ct.Must(t, err)
	if got := rec.All(); len(got) != 1 || got[0].Expected != "0" {
		t.Fatalf("first commit %v; want one Create", got)
	}
	// Pin the module on the node and release v2: the want stays at v1.
	spec.Policies = map[string]*typev1.Policy{"sshd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_PINNED, "frozen")}
	c.PutNode(t, spec)
	v2 := w.Release(t, ct.SSHD("2.0", ""), nil)
	waitFingerprint(t, c, "sshd", v2)
	mark := rec.Mark()
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatal(res.Err)
	}
	got := rec.Since(mark)
	if len(got) != 1 || got[0].Expected != fmt.Sprint(rev1) {
		t.Fatalf("second commit %v; want one Update at r%d", got, rev1)
	}
	a, _, _ := w.Assignment(t, "ace")
	if ct.Want(a, "sshd").GetFingerprint() != v1 || len(a.GetHolds()) != 1 {
		t.Fatalf("wants %v holds %v", a.GetWants(), a.GetHolds())
	}
	// The params change, and the composition v1's want names is lost: it
	// cannot be rebuilt to the same digest, so the assignment may not
	// name it any more.
	spec.Modules[0].Params.Fields["port"] = structpb.NewNumberValue(2222)
	c.PutNode(t, spec)
	ct.Must(t, w.KV(t, natsx.BucketCompositions).Delete(context.Background(), ct.Want(a, "sshd").GetCompositionKey()))
	if res := c.Pass(t, "ace"); res.Err != nil || !res.Committed {
		t.Fatal(res.Err)
	}
	a, _, _ = w.Assignment(t, "ace")
	if ct.Want(a, "sshd") != nil {
		t.Errorf("the assignment wants a composition that is not held: %v", ct.Want(a, "sshd"))
	}
	if len(a.GetHolds()) != 1 || !strings.Contains(a.GetHolds()[0].GetReason(), "is no longer held") {
		t.Errorf("holds %v", a.GetHolds())
	}
	if _, err := w.CheckAssignment(t, a); err != nil {
		t.Error(err)
	}
}

// TestPrune covers DESIGN.md §5.2 step 8: of a module with more than 5
// compositions the 5 newest by the server's timestamp of their last write
// are kept, plus those the wants or the applied manifest name; each other
// one goes, its judgement record first; keys that do not parse are never
// touched.
func TestPrune(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	spec := ct.Spec("ace", "motd")
	c.PutNode(t, spec)
	var keys []string
	release := func(v int) string {
		fp := w.Release(t, ct.Motd(fmt.Sprintf("%d.0", v)), nil)
		waitFingerprint(t, c, "motd", fp)
		if res := c.Pass(t, "ace"); res.Err != nil {
			t.Fatal(res.Err)
		}
		key := "ace.motd." + names.FingerprintHex(fp)
		keys = append(keys, key)
		return key
	}
	release(1)
	a1, _, _ := w.Assignment(t, "ace")
	release(2)
	a2, _, _ := w.Assignment(t, "ace")
	// The engine applied v1's manifest; then the node is pinned at v2.
	applyAll(t, w, a1)
	spec.Policies = map[string]*typev1.Policy{"motd": ct.Policy(typev1.UpgradePolicy_UPGRADE_POLICY_PINNED, "")}
	c.PutNode(t, spec)
	for v := 3; v <= 7; v++ {
		release(v)
	}
	// v1 named by the applied manifest, v2 by the wants, v3..v7 the 5
	// newest: nothing goes yet.
	unparseable := []string{"ace.motd.nothex", "ace.motd.0000"}
	for _, k := range unparseable {
		_, err := w.KV(t, natsx.BucketCompositions).Put(context.Background(), k, []byte("x"))
		ct.Must(t, err)
	}
	comps := w.KV(t, natsx.BucketCompositions)
	held := func() []string {
		ks, err := comps.ListKeys(context.Background(), "ace.motd.*")
		ct.Must(t, err)
		return ks
	}
	if got := len(held()); got != 9 {
		t.Fatalf("%d keys held, want 7 compositions and 2 unparseable keys", got)
	}
	// Rewrite v3 (a repair), so by the time of its last write it is the
	// newest: the order is the server's write time, not the order made.
	_, err := comps.Put(context.Background(), keys[2], []byte("corrupt"))
	ct.Must(t, err)
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	rec := w.RecordWrites(t, natsx.BucketCompositions, natsx.BucketComposed)
	release(8)
	// Newest by write time: v8, v3 (rewritten), v7, v6, v5; kept besides:
	// v1 (applied manifest), v2 (wanted). v4 goes.
	var deletes []string
	for _, wr := range rec.All() {
		if wr.Op == "DEL" {
			deletes = append(deletes, wr.Bucket+"/"+wr.Key)
		}
	}
	if want := []string{"composed/" + keys[3], "compositions/" + keys[3]}; !slices.Equal(deletes, want) {
		t.Errorf("deleted %v, want %v (record first)", deletes, want)
	}
	got := held()
	for i, k := range keys {
		if present := slices.Contains(got, k); present != (i != 3) {
			t.Errorf("v%d (%s) held=%v", i+1, k, present)
		}
	}
	for _, k := range unparseable {
		if !slices.Contains(got, k) {
			t.Errorf("unparseable key %s was touched", k)
		}
	}
	if ct.Want(a2, "motd").GetCompositionKey() != keys[1] {
		t.Fatal("v2 is not the wanted key")
	}
}

// TestObjectSweep covers the mark and sweep of DESIGN.md §5.2 step 8 with an
// injected clock: an object no held composition names is deleted once it
// stayed unnamed for 24 h; named objects, and those a pass is about to name,
// stay.
func TestObjectSweep(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	big := fill(lint.MaxInlineContent+1, 'n')
	spec := ct.Spec("ace")
	spec.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big)}
	c.PutNode(t, spec)
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	ctx := context.Background()
	put := func(b []byte) string {
		d := names.Digest(b)
		_, err := natsx.PutObject(ctx, c.Store.Objects, d, bytes.NewReader(b), int64(len(b)))
		ct.Must(t, err)
		return d
	}
	named, stray, touched := names.Digest(big), put([]byte("stray")), put([]byte("about to be named"))
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := objects.New(c.Store, objects.DefaultGrace, nil, func() time.Time { return now })
	has := func(d string) bool {
		_, err := c.Store.Objects.GetInfo(ctx, d)
		return err == nil
	}
	sweep := func() int {
		n, err := s.Sweep(ctx)
		ct.Must(t, err)
		return n
	}
	if n := sweep(); n != 0 {
		t.Fatalf("the first sweep deleted %d objects", n)
	}
	now = now.Add(objects.DefaultGrace - time.Minute)
	if n := sweep(); n != 0 {
		t.Fatalf("a sweep before the grace deleted %d objects", n)
	}
	now = now.Add(2 * time.Minute)
	s.Touch(touched)
	if n := sweep(); n != 1 || has(stray) || !has(named) || !has(touched) {
		t.Fatalf("sweep after 24h deleted %d: stray %v named %v touched %v", n, has(stray), has(named), has(touched))
	}
	// The composition stops naming the big file: it is marked, then goes
	// 24 h later.
	spec.Resources = nil
	c.PutNode(t, spec)
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	now = now.Add(time.Hour)
	sweep()
	now = now.Add(objects.DefaultGrace)
	if n := sweep(); n != 2 || has(named) || has(touched) {
		t.Errorf("deleted %d; named %v touched %v", n, has(named), has(touched))
	}
}

// aceWithTwoModules starts a composer that passes only when asked, with
// sshd and motd released and placed on node ace, not yet composed.
func aceWithTwoModules(t *testing.T) (w *ct.World, c *ct.Composer, sshdFP, motdFP string) {
	t.Helper()
	w = ct.New(t)
	c = w.StartManual(t, "one")
	sshdFP = w.Release(t, ct.SSHD("1.0", ""), nil)
	motdFP = w.Release(t, ct.Motd("1.0"), nil)
	waitFingerprint(t, c, "sshd", sshdFP)
	waitFingerprint(t, c, "motd", motdFP)
	c.PutNode(t, ct.Spec("ace", "sshd", "motd"))
	return w, c, sshdFP, motdFP
}

// TestSigningBatched covers DESIGN.md §5.2 step 3: every composition of a
// node that differs is signed in one batch — one SignCompositions request
// naming them all, not one request per composition.
func TestSigningBatched(t *testing.T) {
	t.Parallel()
	w, c, sshdFP, motdFP := aceWithTwoModules(t)
	before := len(auditLines(t, w))
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	var requests [][]string
	for _, r := range auditLines(t, w)[before:] {
		if r.Method != "SignCompositions" {
			continue
		}
		var keys []string
		for _, it := range r.Items {
			keys = append(keys, it.Key)
		}
		slices.Sort(keys)
		requests = append(requests, keys)
	}
	want := []string{"ace.motd." + names.FingerprintHex(motdFP), "ace.node", "ace.sshd." + names.FingerprintHex(sshdFP)}
	if len(requests) != 1 || !slices.Equal(requests[0], want) {
		t.Errorf("SignCompositions requests of the pass: %v; want one naming %v", requests, want)
	}
}

// TestOwnWrittenLast covers the order of DESIGN.md §5.2 step 6: the
// modules' compositions are written first and the node's own last, so a
// node's own composition is never written before the modules' of its pass.
func TestOwnWrittenLast(t *testing.T) {
	t.Parallel()
	w, c, _, _ := aceWithTwoModules(t)
	rec := w.RecordWrites(t, natsx.BucketCompositions)
	if res := c.Pass(t, "ace"); res.Err != nil {
		t.Fatal(res.Err)
	}
	var keys []string
	for _, wr := range rec.All() {
		keys = append(keys, wr.Key)
	}
	if len(keys) != 3 || keys[2] != "ace.node" {
		t.Errorf("compositions written in the order %v; want both modules' and then ace.node", keys)
	}
}

// TestObjectSweepNamedAgain covers the mark of DESIGN.md §5.2 step 8: an
// object a composition names again loses its mark, so once unnamed again
// its grace starts over instead of counting from the first mark.
func TestObjectSweepNamedAgain(t *testing.T) {
	t.Parallel()
	w := ct.New(t)
	c := w.StartManual(t, "one")
	big := fill(lint.MaxInlineContent+1, 'a')
	digest := names.Digest(big)
	spec := ct.Spec("ace")
	setNamed := func(named bool) {
		t.Helper()
		spec.Resources = nil
		if named {
			spec.Resources = []*typev1.Resource{inline("local:big", "/etc/big", big)}
		}
		c.PutNode(t, spec)
		if res := c.Pass(t, "ace"); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := objects.New(c.Store, objects.DefaultGrace, nil, func() time.Time { return now })
	sweep := func() int {
		t.Helper()
		n, err := s.Sweep(ctx)
		ct.Must(t, err)
		return n
	}
	setNamed(true)
	setNamed(false)
	sweep() // marked, unnamed
	setNamed(true)
	now = now.Add(time.Hour)
	sweep() // named again: the mark goes
	setNamed(false)
	now = now.Add(22 * time.Hour)
	sweep() // unnamed again: a new mark
	now = now.Add(2 * time.Hour)
	// 25 h after the first mark, 2 h after the new one.
	if n := sweep(); n != 0 {
		t.Errorf("the sweep deleted %d objects 2 h after the object was unnamed again", n)
	}
	if _, err := c.Store.Objects.GetInfo(ctx, digest); err != nil {
		t.Errorf("the object is gone: %v", err)
	}
}
