package app_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"mesh.dev/internal/names"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// TestFetchesThatFailOrHang: a fetch that fails, or hangs because the
// server's own read lost its reply (a nats-server restart under the
// composer or the catalog), costs the pass its bound and no more — the
// composition's deadline, or the stall time of an object or artifact
// stream, not the 5 minutes of a whole fetch — and the pass runs again
// soon after by itself, not at the next drift pass a minute later: once the
// server answers again, the manifest is applied with nothing else asking
// for a pass.
func TestFetchesThatFailOrHang(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	bin1, bin2 := []byte("#!/bin/sh\necho 1\n"), []byte("#!/bin/sh\necho 2\n")
	big := []byte(strings.Repeat("object content\n", 100))
	conf := func(s string) *typev1.Resource { return file("web", "conf", "/etc/app/web.conf", s) }
	binary := artifactFile("web", "bin", "/opt/app/web", "binary:web")
	object := &typev1.Resource{Id: "web:big", Module: "web", Type: typev1.ResourceType_RESOURCE_TYPE_FILE, Path: "/etc/app/big", Mode: 0o640,
		Owner: "root", Group: "root", Content: &typev1.Resource_Object{Object: &typev1.ObjectRef{Digest: names.Digest(big), Size: int64(len(big))}}}
	part := func(b []byte) []*typev1.Artifact {
		return []*typev1.Artifact{{Ref: "binary:web", Digest: names.Digest(b), Size: int64(len(b))}}
	}
	tests := []struct {
		name string
		// next is the second manifest's web resources and parts; faulty
		// the key or digest whose fetch meets fault; catalog whether the
		// catalog serves it (else the composer).
		next    []*typev1.Resource
		parts   []*typev1.Artifact
		faulty  string
		catalog bool
		fault   error
		// reason is in the failed attempt's reason.
		reason string
	}{
		{name: "composition refused at once", next: []*typev1.Resource{conf("v2"), binary}, parts: part(bin1),
			fault: status.Error(codes.Unavailable, "composer replica restarting"), reason: "composer replica restarting"},
		{name: "composition never answered", next: []*typev1.Resource{conf("v2"), binary}, parts: part(bin1),
			fault: errHang, reason: "DeadlineExceeded"},
		{name: "object never sent", next: []*typev1.Resource{conf("v1"), binary, object}, parts: part(bin1), faulty: names.Digest(big),
			fault: errHang, reason: "nothing received for " + bound.String()},
		{name: "artifact never sent", next: []*typev1.Resource{conf("v1"), binary}, parts: part(bin2), faulty: names.Digest(bin2), catalog: true,
			fault: errHang, reason: "nothing received for " + bound.String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			r := w.start(t, options{compositionDeadline: bound, fetchStall: bound})
			w.catalog.mu.Lock()
			w.catalog.artifacts[names.Digest(bin1)] = bin1
			w.catalog.artifacts[names.Digest(bin2)] = bin2
			w.catalog.mu.Unlock()
			w.composer.mu.Lock()
			w.composer.objects[names.Digest(big)] = big
			w.composer.mu.Unlock()
			fp := w.release("web", "1.0.0", nil, "binary:web")
			first := moduleComp("web", fp, conf("v1"), binary)
			first.parts = part(bin1)
			r.waitApplied(t, w.publish(manifestOpts{}, first, nodeComp()))

			// The same fingerprint: the entry is held, so nothing but
			// the engine itself asks for a pass once the fetch failed.
			next := moduleComp("web", fp, tt.next...)
			next.parts = tt.parts
			faulty := tt.faulty
			if faulty == "" {
				faulty, _ = names.CompositionKey(node, "web", fp)
			}
			faults, mu := w.composer.faults, &w.composer.mu
			if tt.catalog {
				faults, mu = w.catalog.faults, &w.catalog.mu
			}
			mu.Lock()
			faults[faulty] = tt.fault
			mu.Unlock()
			start := time.Now()
			m := w.publish(manifestOpts{}, next, nodeComp())
			a := r.waitAttempt(t, "web", stateFailed, composerv1.ReasonCode_REASON_CODE_FETCH_FAILED)
			if !strings.Contains(a.GetReason(), tt.reason) {
				t.Errorf("failed attempt: %q, want it to say %q", a.GetReason(), tt.reason)
			}
			t.Logf("the fetch failed %s after the manifest came: %s", time.Since(start).Round(time.Millisecond), a.GetReason())

			mu.Lock()
			delete(faults, faulty)
			mu.Unlock()
			r.waitApplied(t, m)
		})
	}
}
