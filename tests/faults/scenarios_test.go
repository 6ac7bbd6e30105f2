package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/natsx"
	"mesh.dev/internal/testutil"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	nodeenginev1 "mesh.dev/proto/mesh/nodeengine/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
	signerapp "mesh.dev/services/signer/app"
)

// TestComposerKilledBetweenSignAndWrite: the signer signs a batch of
// compositions and, before its answer leaves, the composer that asked is
// killed: signatures exist that were never written. Restarted, the composer
// composes again; no manifest ever names what was not written.
func TestComposerKilledBetweenSignAndWrite(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		c := r.m.Composers[0]
		wait := r.armSigner(faultPlan{Method: "SignCompositions", Nth: 1 + r.rng.IntN(2), KillPID: c.Pid()})
		r.newMotd(i)
		f := wait(time.Minute)
		c.WaitEnded(30 * time.Second)
		r.disarmSigner()
		// Invariant 1 at the worst moment: the composer is dead with
		// signatures it never wrote.
		r.m.Rec.checkCurrent(false)
		// What the signer signed in that call was not written when the
		// composer died.
		unwritten := 0
		for _, d := range f.Digests {
			if !r.m.Rec.Written(d) {
				unwritten++
			}
		}
		if !f.Killed || unwritten == 0 {
			r.t.Fatalf("the kill did not land between sign and write: %+v, %d of %d signed digests unwritten", f, unwritten, len(f.Digests))
		}
		r.note("iteration %d: %d signed compositions never written when the composer died", i, unwritten)
		c.Start()
		r.healed("composer restarted")
	})
}

// TestComposerKilledBetweenModuleWritesAndAssignment: the composer is
// killed once it wrote some module compositions of a pass and before it
// committed the nodes' assignments (the commit point of DESIGN.md §5.2.7).
// Nothing the current manifests name may go missing; restarted, it
// finishes the work.
func TestComposerKilledBetweenModuleWritesAndAssignment(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		c := r.m.Composers[0]
		killed := make(chan struct{})
		// Every node's pass writes its motd composition first (modules are
		// written before the node's own, and the assignment after both).
		cancel := r.onWrites(natsx.BucketCompositions, 1+r.rng.IntN(len(r.m.Engines)), func() {
			c.proc.Signal(syscall.SIGKILL)
			close(killed)
		})
		defer cancel()
		fp := r.newMotd(i)
		select {
		case <-killed:
		case <-time.After(time.Minute):
			r.t.Fatal("the composer wrote no composition to be killed after")
		}
		c.WaitEnded(30 * time.Second)
		// Invariant 1 at the worst moment: the composer is dead between
		// its module writes and its assignments.
		r.m.Rec.checkCurrent(false)
		// Which nodes' assignments still want the old motd: those the kill
		// caught between their module writes and their assignment.
		caught := 0
		for _, e := range r.m.Engines {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			a, _, err := r.m.Assignment(ctx, e.Node)
			cancel()
			if err != nil {
				r.t.Fatal(err)
			}
			for _, w := range a.GetWants() {
				if w.GetModule() == "motd" && w.GetFingerprint() != fp {
					caught++
				}
			}
		}
		r.note("iteration %d: %d of %d assignments not committed at the kill", i, caught, len(r.m.Engines))
		c.Start()
		r.healed("composer restarted")
	})
}

// TestSignerKilledMidBatch: the signer is killed while it signs a batch of
// compositions or manifests, at a random moment from its arrival (before
// its request record, between its records, or with the signed record made
// and the answer not sent). Its audit chain still verifies, no revision it
// acknowledged is handed out again, and the composer gets on once it is
// back.
func TestSignerKilledMidBatch(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		method := pick(r, []string{"SignCompositions", "SignManifests"})
		wait := r.armSigner(faultPlan{Method: method, Nth: 1 + r.rng.IntN(2), KillSelfAfter: r.between(0, 3*time.Millisecond)})
		r.newMotd(i)
		f := wait(time.Minute)
		r.m.Signer.WaitEnded(30 * time.Second)
		r.disarmSigner()
		rep, err := signerapp.VerifyAudit(filepath.Join(r.m.Dir, "signer", "state"))
		if err != nil {
			r.t.Fatalf("audit verify after the kill: %v", err)
		}
		r.note("iteration %d: %s; audit chain of %d records verifies (torn tail %v)", i, f.What, rep.Records, rep.Torn)
		r.m.Signer.Start()
		r.healed("signer restarted")
	})
}

// TestJetStreamRestoredFromOlderSnapshot: nats-server's store goes back to
// a snapshot taken before the last change (what a power loss does to a
// disk that lied about its fsyncs, or a VM restored from an image; kill -9
// never does it): acknowledged writes are gone, among them the manifests
// the engines applied last. The mesh must converge again on what the store
// now says, with manifest revisions that still only go up, and then on the
// change published again.
func TestJetStreamRestoredFromOlderSnapshot(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		snap := filepath.Join(r.m.Dir, "snapshots", fmt.Sprintf("%d", i))
		r.m.NATS.Stop()
		r.m.NATS.Snapshot(snap)
		r.m.NATS.Start()
		r.m.Rec.Rewatch()
		before := cloneExpect(r.expect)
		r.healed("nats-server restarted after the snapshot")
		r.newMotd(i)
		r.healed("the change before the loss")
		r.m.NATS.Kill()
		r.m.NATS.Restore(snap)
		r.m.NATS.Start()
		r.m.Rec.Rewatch()
		// The registration of the new motd is gone with the rest: the
		// fleet goes back to what the store says, at higher revisions.
		r.expect = before
		r.healed("the store went back to the snapshot")
		r.newMotd(i)
		r.healed("the change published again")
	})
}

// TestKeyRotationDrill: a keyset listing the old key RETIRED and a new one
// ACTIVE, the signer restarted on the new key; then a keyset without the
// old key. No engine reports a failed apply at any point, and everything
// ends signed by the new key.
func TestKeyRotationDrill(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		from := time.Now()
		old := r.m.SigningKey
		next := testutil.NewKey(t)
		r.m.Keyset = &Keyset{Version: r.m.Keyset.Version + 1, Keys: []KeysetKey{{Key: old, State: KeyRetired}, {Key: next, State: KeyActive}}}
		r.m.SigningKey = next
		r.m.Signer.Stop()
		r.m.writeSignerKey()
		r.m.Signer.Start()
		r.healed("signer restarted on the new key")
		r.waitSignedBy(KeyID(next))
		r.m.Keyset = &Keyset{Version: r.m.Keyset.Version + 1, Keys: []KeysetKey{{Key: next, State: KeyActive}}}
		r.m.writeKeyset()
		r.waitKeysetTaken(r.m.Keyset.Version)
		r.newMotd(i)
		r.healed("the old key left the keyset")
		if failed := r.m.Rec.FailedSince(from); len(failed) > 0 {
			r.t.Errorf("the rotation drill made engines fail %d applies, first %s", len(failed), failed[0])
		}
		r.note("iteration %d: keyset version %d, no failed apply", i, r.m.Keyset.Version)
	})
}

// TestRevokedKey: the signer's key is revoked (a keyset listing it REVOKED
// and a new key ACTIVE) and the signer restarted on the new key. Nothing
// the revoked key signed is applied once an engine holds that keyset; the
// fleet converges on what the new key signs.
func TestRevokedKey(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		bad := r.m.SigningKey
		next := testutil.NewKey(t)
		r.m.Keyset = &Keyset{Version: r.m.Keyset.Version + 1, Keys: []KeysetKey{{Key: bad, State: KeyRevoked}, {Key: next, State: KeyActive}}}
		r.m.SigningKey = next
		r.m.Signer.Stop()
		r.m.writeSignerKey()
		r.m.Signer.Start()
		r.newMotd(i)
		r.healed("the revoked key replaced")
		r.waitSignedBy(KeyID(next))
		r.waitKeysetTaken(r.m.Keyset.Version)
		// The revoked key signs on: a manifest above the applied one,
		// written straight into a node's assignment. The engine must
		// refuse it (the recorder flags it if applied).
		e := pick(r, r.m.Engines)
		from := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rev := r.forgeManifest(ctx, e.Node, bad, nil)
		f := r.waitRefused(e.Node, from, composerv1.ReasonCode_REASON_CODE_EXPIRED)
		r.newMotd(100 + i)
		r.healed("a manifest signed by the revoked key refused by " + e.Node)
		r.note("iteration %d: key %s revoked; r%d it signed refused by %s: %s", i, KeyID(bad), rev, e.Node, f.Reason)
	})
}

// TestNodeDeletedAndRecreated: a node's spec is deleted and put again (a
// machine re-provisioned under its name): its manifest revisions never go
// back, and it converges.
func TestNodeDeletedAndRecreated(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		idx := r.rng.IntN(len(r.m.Engines))
		node := r.m.Engines[idx].Node
		r.waitFor("delete node "+node, time.Minute, func() error {
			return r.m.Operator(func(ctx context.Context, c composerv1.ComposerServiceClient) error {
				_, err := c.DeleteNode(ctx, &composerv1.DeleteNodeRequest{Node: node})
				return err
			})
		})
		time.Sleep(r.between(0, 2*time.Second))
		r.newMotd(i)
		if r.rng.IntN(2) == 0 {
			// The engine restarts meanwhile, as a re-provisioned machine's.
			r.m.Engines[idx].Kill()
			r.m.Engines[idx].Start()
		}
		r.m.PutNode(node, idx)
		r.healed("node " + node + " put again")
		r.note("iteration %d: %s deleted and put again", i, node)
	})
}

// TestNATSRestartedDuringBulkCompose: nats-server is restarted — gracefully
// or with kill -9 — while the composer composes every module anew for
// every node (new versions of all of them at once).
func TestNATSRestartedDuringBulkCompose(t *testing.T) {
	for _, how := range []string{"graceful", "kill -9"} {
		t.Run(strings.ReplaceAll(how, " ", ""), func(t *testing.T) {
			scenario(t, Options{Nodes: []string{"ace", "bay", "cod", "dab", "eel", "fin"}}, func(r *run, i int) {
				// nats-server comes back as soon as it is gone, as a
				// supervisor restarts it: the publishes below may be
				// what it went down in the middle of, and wait for it.
				restarted := make(chan error, 1)
				cancel := r.onWrites(natsx.BucketCompositions, 1+r.rng.IntN(12), func() {
					go func() {
						if how == "graceful" {
							r.m.NATS.Stop()
						} else {
							r.m.NATS.Kill()
						}
						restarted <- r.m.NATS.start()
					}()
				})
				defer cancel()
				r.newMotd(i)
				r.expect["sshd"] = r.m.publish("sshd", changedCopy(t, "sshd", "files/sshd_config", fmt.Sprintf("# %s %d\n", t.Name(), i)))
				r.expect["ca-bundle"] = r.m.publish("ca-bundle", changedCopy(t, "ca-bundle", "files/ca-bundle.pem", fmt.Sprintf("# %s %d\n", t.Name(), i)))
				select {
				case err := <-restarted:
					must(r.t, err)
				case <-time.After(time.Minute):
					r.t.Fatal("the composer wrote nothing to restart nats-server in the middle of")
				}
				r.m.Rec.Rewatch()
				r.healed("nats-server back (" + how + ")")
			})
		})
	}
}

// TestTwoComposersRacing: the lease holder is paused (SIGSTOP: a GC storm,
// a VM paused) with a sign request in flight that reaches the signer only
// once the other replica took the lease and was fenced in with a new epoch;
// then the old holder resumes and goes on with its pass, racing the new
// holder on the same keys. Its late sign request carries a fencing epoch
// the signer refuses, nothing is ever signed in an epoch below one fenced
// in before it, and its writes are CAS: it can neither sign nor overwrite.
func TestTwoComposersRacing(t *testing.T) {
	scenario(t, Options{Composers: 2}, func(r *run, i int) {
		old := r.leaseHolder()
		release := filepath.Join(r.m.Dir, "signer", fmt.Sprintf("release-%d", i))
		method := pick(r, []string{"SignCompositions", "SignManifests"})
		wait := r.armSignerN(faultPlan{Method: method, Nth: 1, PausePID: old.Pid(), Release: release})
		r.newMotd(i)
		if f := wait(1, time.Minute); !f.Stalled {
			r.t.Fatalf("the signer did not hold %s's request: %+v", old.Name, f)
		}
		next := r.leaseHolder2(old)
		// The new holder composes the change: it was fenced in.
		r.healed("the other replica took over with " + old.Name + " paused")
		must(r.t, os.WriteFile(release, nil, 0o600))
		f := wait(2, time.Minute)
		r.disarmSigner()
		if !strings.Contains(f.Err, "fencing epoch") {
			r.t.Errorf("%s's %s, held until %s was fenced in, was not refused for its stale fencing epoch: %+v", old.Name, method, next.Name, f)
		}
		old.Resume()
		r.newMotd(100 + i)
		r.healed(old.Name + " resumed")
		stale, refusals := r.staleSigned()
		for _, s := range stale {
			r.t.Errorf("the signer signed for a fenced-out holder: %s", s)
		}
		r.note("iteration %d: %s paused with %s in flight, %s took over; the late request: %q; stale-epoch refusals in the audit: %d", i, old.Name, method, next.Name, f.Err, refusals)
	})
}

// TestLeaseHolderKilled: the lease holder is killed at a random moment
// after a change; the other replica takes over within the lease TTL and
// the fleet converges; the killed replica comes back as a standby.
func TestLeaseHolderKilled(t *testing.T) {
	scenario(t, Options{Composers: 2}, func(r *run, i int) {
		old := r.leaseHolder()
		r.newMotd(i)
		time.Sleep(r.between(0, 500*time.Millisecond))
		old.Kill()
		killedAt := time.Now()
		next := r.leaseHolder2(old)
		r.note("iteration %d: %s took the lease %.1fs after %s was killed", i, next.Name, time.Since(killedAt).Seconds(), old.Name)
		r.healed("the other replica took over")
		old.Start()
	})
}

// TestEngineCutOffAndHealed: one engine is cut off the composers (every
// connection dropped, none let through) while a change goes out: the
// others converge, it applies nothing new; healed, it converges.
func TestEngineCutOffAndHealed(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		cut := pick(r, r.m.Engines)
		cut.Proxy.Cut()
		fp := r.newMotd(i)
		var rest []string
		for _, e := range r.m.Engines {
			if e != cut {
				rest = append(rest, e.Node)
			}
		}
		r.healed("the others, with "+cut.Node+" cut off", rest...)
		if err := r.m.Converged(r.expect, cut.Node); err == nil {
			r.t.Fatalf("%s converged on motd %s while cut off", cut.Node, fp)
		}
		time.Sleep(r.between(0, 2*time.Second))
		cut.Proxy.Heal()
		r.healed(cut.Node + " healed")
	})
}

// TestEngineKilledMidApply: an engine kills itself (SIGKILL) inside an
// apply of a change of two modules — after a number of its ops drawn from
// the seed, between two ops or after the last one and before the commit —
// and is then opened alone, which replays the journal the kill left and does
// nothing else (no pass, no stream: nothing but the journal can finish the
// change). Then, for each changed module, the file on disk is the new one
// exactly when the engine's kept state says the new composition is applied:
// never a file written with its module still recorded at the previous
// composition (a half apply), never the reverse. Restarted and healed, the
// fleet converges and the motd on disk is the new one.
func TestEngineKilledMidApply(t *testing.T) {
	files := map[string]string{"motd": "etc/motd", "ca-bundle": "etc/ssl/certs/mesh-ca-bundle.pem"}
	scenario(t, Options{}, func(r *run, i int) {
		e := pick(r, r.m.Engines)
		tag := fmt.Sprintf("%s iteration %d", t.Name(), i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		before, err := e.Status(ctx)
		cancel()
		must(t, err)
		prev := appliedByModule(before)
		// Cut off while the change is composed, the engine gets all of it
		// at once when healed.
		e.Proxy.Cut()
		r.expect["motd"] = r.m.PublishMotd(tag)
		r.expect["ca-bundle"] = r.m.publish("ca-bundle", changedCopy(t, "ca-bundle", "files/ca-bundle.pem", "# "+tag+"\n"))
		r.composedFor(e.Node, "motd", "ca-bundle")
		firedPath := filepath.Join(r.m.Dir, fmt.Sprintf("engine-fired-%d.jsonl", i))
		plan, err := json.Marshal(engineFault{AfterOps: 1 + r.rng.IntN(1000), Fired: firedPath})
		must(t, err)
		must(t, os.WriteFile(e.spec.Faults+".tmp", plan, 0o600))
		must(t, os.Rename(e.spec.Faults+".tmp", e.spec.Faults))
		e.Proxy.Heal()
		e.WaitEnded(time.Minute)
		b, err := os.ReadFile(firedPath)
		if err != nil {
			r.t.Fatalf("%s ended without killing itself mid-apply: %v\n%s", e.Node, err, e.Output(8<<10))
		}
		var what fired
		must(t, json.Unmarshal(b, &what))

		kept := appliedByModule(e.Opened())
		var moved []string
		for module, file := range files {
			content, err := os.ReadFile(filepath.Join(e.Root, file))
			if err != nil {
				r.t.Fatalf("%s after %s and a replay: /%s: %v", e.Node, what.What, file, err)
			}
			onDisk := strings.Contains(string(content), tag)
			recorded := kept[module] != prev[module]
			switch {
			case onDisk && !recorded:
				r.t.Fatalf("%s after %s and a replay: /%s is the new %s, but the engine keeps the previous composition %s applied: the apply is half done (the journal was not finished)",
					e.Node, what.What, file, module, prev[module])
			case !onDisk && recorded:
				r.t.Fatalf("%s after %s and a replay: the engine keeps composition %s of %s applied, but /%s is still the previous one",
					e.Node, what.What, kept[module], module, file)
			case onDisk:
				moved = append(moved, module)
			}
		}
		sort.Strings(moved)
		must(t, os.Remove(e.spec.Faults))
		e.Start()
		r.healed(e.Node + " restarted")
		motd, err := os.ReadFile(filepath.Join(e.Root, "etc", "motd"))
		if err != nil || !strings.Contains(string(motd), tag) {
			r.t.Fatalf("%s: /etc/motd after the kill is %q (%v), want the version saying %q", e.Node, motd, err, tag)
		}
		r.note("iteration %d: %s %s; the replay left %v new", i, e.Node, what.What, moved)
	})
}

// appliedByModule is the applied composition digest of each module an
// engine's status reports.
func appliedByModule(st *nodeenginev1.GetStatusResponse) map[string]string {
	out := map[string]string{}
	for _, h := range st.GetHaves() {
		out[h.GetModule()] = h.GetApplied().GetDigest()
	}
	return out
}

// TestCorruptCompositionAndObject: bad bytes are written straight into a
// composition key and into an object a node is about to fetch (the engine
// is cut off while the composer writes them, and the corruption lands
// before it is healed). The engine refuses them and reports why; the
// composer repairs both; the fleet converges.
func TestCorruptCompositionAndObject(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		e := pick(r, r.m.Engines)
		var key, object string
		var from time.Time
		// The composer repairs what it did not write about 2 s after it
		// lands; an engine slow to come back (its reconnect backoff, a
		// loaded machine) can find the genuine bytes again and prove
		// nothing. Then the change is made anew, up to corruptAttempts.
		attempt := 0
		for ; ; attempt++ {
			if attempt == corruptAttempts {
				r.t.Fatalf("%s never fetched the corrupt bytes in %d attempts: the composer repaired them first each time", e.Node, attempt)
			}
			e.Proxy.Cut()
			from = time.Now()
			tag := fmt.Sprintf("%s iteration %d attempt %d", t.Name(), i, attempt)
			r.expect["motd"] = r.m.PublishMotd(tag)
			r.expect["ca-bundle"] = r.m.publish("ca-bundle", changedCopy(t, "ca-bundle", "files/ca-bundle.pem", "# "+tag+"\n"))
			key = wantOf(r.composedFor(e.Node, "motd", "ca-bundle"), "motd").GetCompositionKey()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var err error
			object, err = r.newObjectOf(ctx, e.Node, "ca-bundle")
			must(t, err)
			must(t, r.m.CorruptComposition(ctx, key))
			must(t, r.m.CorruptObject(ctx, object))
			cancel()
			e.Proxy.Heal()
			if r.refusedOrRepairedFirst(e, from) {
				break
			}
			r.note("iteration %d attempt %d: the composer repaired %s first", i, attempt, key)
		}
		r.healed("the composer repaired " + key + " and object " + object)
		// A context of its own: the one of the corruption may have run out
		// while the fleet converged (up to ConvergeBound).
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		for what, ok := range map[string]func() (bool, error){
			key:    func() (bool, error) { return r.m.CompositionHeld(cctx, key, "") },
			object: func() (bool, error) { return r.m.ObjectHeld(cctx, object) },
		} {
			if held, err := ok(); err != nil || !held {
				r.t.Fatalf("%s not repaired: %v", what, err)
			}
			r.m.Rec.Repaired(what)
		}
		var codes []string
		for _, f := range r.m.Rec.FailedSince(from) {
			codes = append(codes, f.Code.String())
		}
		r.note("iteration %d: %s refused with %s", i, e.Node, strings.Join(codes, ", "))
	})
}

// corruptAttempts bounds how often TestCorruptCompositionAndObject makes
// its change anew when the composer repaired the corruption before the
// engine fetched it.
const corruptAttempts = 3

// refusedOrRepairedFirst waits until e reports a failed attempt since from
// (true), or converges on r.expect without one: the composer repaired the
// corruption before e fetched it (false). Neither within a minute fails.
func (r *run) refusedOrRepairedFirst(e *Engine, from time.Time) bool {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, f := range r.m.Rec.FailedSince(from) {
			if f.Node == e.Node {
				return true
			}
		}
		if r.m.Converged(r.expect, e.Node) == nil {
			// Converged: one last look, a report may have come between.
			for _, f := range r.m.Rec.FailedSince(from) {
				if f.Node == e.Node {
					return true
				}
			}
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("%s neither reported the refusal nor converged within a minute", e.Node)
	return false
}

// TestReplayOldManifestAndComposition: an old signed manifest is written
// back into a node's assignment, and an old signed composition into the
// key its current manifest names, straight into JetStream (a replay by
// someone who can write to NATS but holds no key). Signatures verify, so
// only revisions and digests stop them: the engine applies neither, and
// the mesh converges past them.
func TestReplayOldManifestAndComposition(t *testing.T) {
	scenario(t, Options{}, func(r *run, i int) {
		e := pick(r, r.m.Engines)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		oldAssignment, oldComposition := r.rawAssignment(ctx, e.Node), r.rawWantedComposition(ctx, e.Node, "motd")
		r.newMotd(i)
		r.healed("the change before the replay")
		e.Proxy.Cut()
		r.newMotd(100 + i)
		key := wantOf(r.composedFor(e.Node, "motd"), "motd").GetCompositionKey()
		r.putRaw(ctx, natsx.BucketCompositions, key, oldComposition)
		r.m.Rec.Inject(key)
		r.putRaw(ctx, natsx.BucketAssignments, e.Node, oldAssignment)
		e.Proxy.Heal()
		r.healed("replays of an old manifest and composition to " + e.Node)
		r.m.Rec.Repaired(key)
	})
}

// TestReconnectStorm: every engine of a larger fleet loses its stream at
// once and they all come back at once — either a cut healed for all, or
// the composer restarted — while a change goes out.
func TestReconnectStorm(t *testing.T) {
	var nodes []string
	for i := 0; i < 12; i++ {
		nodes = append(nodes, fmt.Sprintf("n%02d", i))
	}
	scenario(t, Options{Nodes: nodes}, func(r *run, i int) {
		if r.rng.IntN(2) == 0 {
			for _, e := range r.m.Engines {
				e.Proxy.Cut()
			}
			r.newMotd(i)
			time.Sleep(r.between(500*time.Millisecond, 2*time.Second))
			for _, e := range r.m.Engines {
				e.Proxy.Heal()
			}
			r.note("iteration %d: %d engines cut and healed at once", i, len(r.m.Engines))
		} else {
			c := r.m.Composers[0]
			c.Kill()
			r.newMotd(i)
			c.Start()
			r.note("iteration %d: the composer restarted under %d engines", i, len(r.m.Engines))
		}
		r.healed("the storm")
	})
}

// TestSlowEngine: one engine stops reading its stream (SIGSTOP) while
// changes go out: the composer never waits for it — the others converge on
// every change — and, resumed, it converges on the latest. The engines dial
// with 64 KiB HTTP/2 windows, and each change comes with a new keyset padded
// with retired keys, so what is due to the stopped engine is well past its
// stream's flow-control window and gRPC's write quota (64 KiB each): the
// composer's Send to it blocks, and must block nothing else.
func TestSlowEngine(t *testing.T) {
	var pad []KeysetKey
	for k := 0; k < slowPadKeys; k++ {
		pad = append(pad, KeysetKey{Key: testutil.NewKey(t), State: KeyRetired})
	}
	scenario(t, Options{SmallWindows: true}, func(r *run, i int) {
		slow := pick(r, r.m.Engines)
		slow.Pause()
		before := slow.Proxy.ToEngine()
		var rest []string
		for _, e := range r.m.Engines {
			if e != slow {
				rest = append(rest, e.Node)
			}
		}
		// One keyset, bigger than the stopped engine's window and write
		// quota together, then the changes: the composer picks the keyset
		// up when it signs the first (it signs under the newest keyset).
		r.m.Keyset = &Keyset{Version: r.m.Keyset.Version + 1, Keys: append([]KeysetKey{{Key: r.m.SigningKey, State: KeyActive}}, pad...)}
		due := proto.Size(r.m.Keyset.Sign(t, r.m.Trust))
		written := time.Now()
		r.m.writeKeyset()
		var worst time.Duration
		for k := 0; k < 3; k++ {
			r.newMotd(10*i + k)
			r.healed("the others, with "+slow.Node+" stopped", rest...)
			// Not merely within ConvergeBound: a Send blocked on the
			// stopped engine's stream that held up the others would be
			// freed by the server's keepalive (after 1m20s at most) and
			// could pass that.
			conv := r.converge[len(r.converge)-1]
			if conv > slowBound {
				r.t.Fatalf("the others waited for stopped %s: change %d converged in %s (bound %s)", slow.Node, k, conv.Round(time.Millisecond), slowBound)
			}
			worst = max(worst, conv)
		}
		r.waitKeysetTakenBy(r.m.Keyset.Version, rest...)
		// The composer polls the signer's keyset every 10 s (and at once
		// when a sign call finds it newer).
		if took := time.Since(written); took > 10*time.Second+slowBound {
			r.t.Fatalf("the others waited for stopped %s: keyset version %d taken %s after it was written", slow.Node, r.m.Keyset.Version, took.Round(time.Millisecond))
		}
		forwarded := slow.Proxy.ToEngine() - before
		if due < 2*smallWindow || forwarded >= int64(due) {
			r.t.Fatalf("%s's stream never filled: a keyset of %d bytes due to it, %d bytes forwarded to it while stopped", slow.Node, due, forwarded)
		}
		slow.Resume()
		r.healed(slow.Node + " resumed")
		r.note("iteration %d: %s stopped: a keyset of %d bytes due to it, %d bytes forwarded to it while stopped; the others converged on each change within %s", i, slow.Node, due, forwarded, worst.Round(time.Millisecond))
	})
}

// slowPadKeys are the retired keys padding each keyset of TestSlowEngine,
// about 170 KiB; slowBound how soon the others converge on each change
// while one engine is stopped.
const (
	slowPadKeys = 2000
	slowBound   = 5 * time.Second
)

// TestClockSkew: one engine's clock is an hour ahead and another's an hour
// behind (the skew DESIGN.md §7 allows) and manifests live 30 minutes, so
// the engine ahead takes them only thanks to that allowance: they verify
// and apply every change. A manifest signed by the genuine key but expired
// (beyond any skew), written straight into a node's assignment, is refused
// as expired; nothing expired or issued too far ahead is applied.
func TestClockSkew(t *testing.T) {
	scenario(t, Options{ClockOffset: map[string]time.Duration{"ace": time.Hour, "bay": -time.Hour}, ManifestLifetime: 30 * time.Minute}, func(r *run, i int) {
		r.newMotd(i)
		r.healed("a change")
		e := pick(r, r.m.Engines)
		from := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rev := r.forgeManifest(ctx, e.Node, r.m.SigningKey, func(m *typev1.Manifest) {
			m.IssuedAt = timestamppb.New(time.Now().Add(-5 * time.Hour))
			m.ExpiresAt = timestamppb.New(time.Now().Add(-4 * time.Hour))
		})
		f := r.waitRefused(e.Node, from, composerv1.ReasonCode_REASON_CODE_EXPIRED)
		r.newMotd(100 + i)
		r.healed("an expired manifest refused by " + e.Node)
		r.note("iteration %d: expired r%d refused by %s (clock %s): %s", i, rev, e.Node, e.Offset, f.Reason)
	})
}
