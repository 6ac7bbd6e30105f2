package service

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	"mesh.dev/internal/natsx"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
)

// Paging of ListEntries.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	// pageBytes bounds the entries of one page so that the response stays
	// under the 4 MiB gRPC message limit (one entry is at most 1 MiB).
	pageBytes = 3 << 20
)

// PutEntry stores an entry after checking every field and the manifest and
// recomputing the fingerprint; the same entry again is a no-op.
func (s *Server) PutEntry(ctx context.Context, req *catalogv1.PutEntryRequest) (*catalogv1.PutEntryResponse, error) {
	const method = "PutEntry"
	e := req.GetEntry()
	ctx, span := s.start(ctx, method, attrFingerprint.String(e.GetFingerprint()), attrModule.String(e.GetModule()))
	defer span.End()
	resp, err := s.putEntry(ctx, e)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	span.SetAttributes(attribute.Bool("mesh.created", resp.GetCreated()))
	return resp, nil
}

func (s *Server) putEntry(ctx context.Context, in *catalogv1.Entry) (*catalogv1.PutEntryResponse, error) {
	if in == nil {
		return nil, invalidf("entry is required")
	}
	if err := knownFields(in); err != nil {
		return nil, invalidf("entry holds fields this catalog does not know, so it cannot check them: %v", err)
	}
	e := proto.Clone(in).(*catalogv1.Entry)
	// created_at is the catalog's to set, and set before the checks: the
	// size limit is judged on the bytes the KV will hold, so an entry a few
	// bytes under it without the timestamp is refused here, naming the
	// entry, rather than by the KV.
	e.CreatedAt = timestamppb.New(s.now())
	if _, err := lint.CheckEntry(e); err != nil {
		return nil, err
	}
	held, created, err := s.store.CreateEntry(ctx, e)
	if err != nil {
		return nil, err
	}
	fp := e.GetFingerprint()
	if created {
		s.m.entries.Add(ctx, 1)
		s.log.InfoContext(ctx, "entry stored", "fingerprint", fp, "module", e.GetModule(), "caller", caller(ctx),
			"repository", e.GetRepository(), "path", e.GetPath(), "commit", e.GetCommit(), "verdict", e.GetVerdict().String())
		return &catalogv1.PutEntryResponse{Fingerprint: fp, Created: true}, nil
	}
	if diff := entryDiff(held, e); len(diff) > 0 {
		return nil, coded(codes.AlreadyExists, "entry %s is held with different %s; entries are immutable", fp, strings.Join(diff, ", "))
	}
	return &catalogv1.PutEntryResponse{Fingerprint: fp, Created: false}, nil
}

// knownFields fails when m holds fields this build's descriptors do not
// know: they would be stored unchecked.
func knownFields(m proto.Message) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	return canonical.Decode(b, m.ProtoReflect().New().Interface())
}

// entryDiff names the fields in which two entries differ, created_at aside.
func entryDiff(a, b *catalogv1.Entry) []string {
	var diff []string
	ra, rb := a.ProtoReflect(), b.ProtoReflect()
	fields := ra.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() == "created_at" {
			continue
		}
		if !fieldEqual(fd, ra, rb) {
			diff = append(diff, string(fd.Name()))
		}
	}
	return diff
}

func fieldEqual(fd protoreflect.FieldDescriptor, a, b protoreflect.Message) bool {
	if a.Has(fd) != b.Has(fd) {
		return false
	}
	return a.Get(fd).Equal(b.Get(fd))
}

// GetEntry returns the entry of a fingerprint.
func (s *Server) GetEntry(ctx context.Context, req *catalogv1.GetEntryRequest) (*catalogv1.GetEntryResponse, error) {
	const method = "GetEntry"
	fp := req.GetFingerprint()
	ctx, span := s.start(ctx, method, attrFingerprint.String(fp))
	defer span.End()
	e, err := s.getEntry(ctx, fp)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	return &catalogv1.GetEntryResponse{Entry: e}, nil
}

func (s *Server) getEntry(ctx context.Context, fp string) (*catalogv1.Entry, error) {
	if err := names.CheckFingerprint("fingerprint", fp); err != nil {
		return nil, invalidf("%v", err)
	}
	e, err := s.store.Entry(ctx, fp)
	if errors.Is(err, natsx.ErrNotFound) {
		return nil, noEntry(fp)
	}
	return e, err
}

// ListEntries pages through the entries by fingerprint, optionally of one
// module, reading only the entries of the page (the store's index orders
// them).
func (s *Server) ListEntries(ctx context.Context, req *catalogv1.ListEntriesRequest) (*catalogv1.ListEntriesResponse, error) {
	const method = "ListEntries"
	ctx, span := s.start(ctx, method, attrModule.String(req.GetModule()))
	defer span.End()
	resp, err := s.listEntries(ctx, req)
	if err != nil {
		return nil, s.fail(ctx, span, method, err)
	}
	span.SetAttributes(attribute.Int("mesh.entries", len(resp.GetEntries())))
	return resp, nil
}

func (s *Server) listEntries(ctx context.Context, req *catalogv1.ListEntriesRequest) (*catalogv1.ListEntriesResponse, error) {
	module := req.GetModule()
	if module != "" {
		if err := names.CheckModule(module); err != nil {
			return nil, invalidf("module: %v", err)
		}
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, invalidf("page_size %d is negative", size)
	case size == 0:
		size = DefaultPageSize
	case size > MaxPageSize:
		size = MaxPageSize
	}
	after, err := parsePageToken(req.GetPageToken(), module)
	if err != nil {
		return nil, err
	}
	// The index names the fingerprints in order; only the page's entries are
	// read. A fingerprint deleted by hand since it was indexed is skipped,
	// and more are asked for in its place.
	resp := &catalogv1.ListEntriesResponse{}
	bytes := 0
	for {
		fps, more, err := s.store.EntryPage(ctx, module, after, size-len(resp.Entries))
		if err != nil {
			return nil, err
		}
		for i, fp := range fps {
			e, err := s.store.Entry(ctx, fp)
			if errors.Is(err, natsx.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if module != "" && e.GetModule() != module {
				s.log.ErrorContext(ctx, "entry indexed under another module; skipped", "fingerprint", fp, "module", e.GetModule(), "indexed", module)
				continue
			}
			n := proto.Size(e)
			if len(resp.Entries) > 0 && bytes+n > pageBytes {
				resp.NextPageToken = pageToken(module, resp.Entries[len(resp.Entries)-1].GetFingerprint())
				return resp, nil
			}
			bytes += n
			resp.Entries = append(resp.Entries, e)
			if len(resp.Entries) == size {
				if more || i+1 < len(fps) {
					resp.NextPageToken = pageToken(module, fp)
				}
				return resp, nil
			}
		}
		if !more || len(fps) == 0 {
			return resp, nil
		}
		after = fps[len(fps)-1]
	}
}

// pageTokenVersion starts every page token, so that the format can change.
const pageTokenVersion = "1"

// pageToken is opaque to clients: the version, the module filter it was
// issued for and the last fingerprint returned.
func pageToken(module, lastFP string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenVersion + "\x00" + module + "\x00" + lastFP))
}

// parsePageToken returns the fingerprint a page starts after; "" for the
// first page.
func parsePageToken(token, module string) (string, error) {
	if token == "" {
		return "", nil
	}
	bad := invalidf("page_token is not a token this catalog issued")
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", bad
	}
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 3 || parts[0] != pageTokenVersion || !names.HasFingerprint(parts[2]) {
		return "", bad
	}
	if parts[1] != module {
		return "", invalidf("page_token was issued for module %q, not %q", parts[1], module)
	}
	return parts[2], nil
}
