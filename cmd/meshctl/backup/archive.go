// Package backup writes the truth buckets and stores of a mesh's JetStream
// (DESIGN.md §9) into one tar archive, checks such an archive, and restores
// it into a JetStream that holds none of them yet. `meshctl backup`,
// `meshctl backup verify` and `meshctl restore` are its command line;
// docs/backup.md is the operator's account.
//
// The archive is a tar file, read and written as a stream, so an artifact
// store larger than memory backs up and restores through a fixed buffer:
//
//	mesh-backup.json                    format, start time, source server
//	kv/<bucket>/<n>.json                one KV message: key, operation, revision,
//	kv/<bucket>/<n>.value               headers, size and sha256 of its value
//	objects/<store>/<n>.json            one object: name, description, headers,
//	objects/<store>/<n>.data            metadata, chunk size, size, sha256
//	manifest.json                       per bucket counts and bytes; every file
//	                                    above with its size and sha256
//	manifest.json.sha256                sha256 of manifest.json
//
// A KV bucket is backed up as every message its stream keeps, in stream
// order: each key's latest value (or delete marker) and, in the buckets that
// keep history (assignments and keysets keep 5), its older kept revisions.
// Restore publishes them again in the same order, so each key ends with the
// same value, headers and kept history; revisions (stream sequences) and
// server timestamps are new, as they must be in another stream. Of the
// derived compositions and objects the archive holds only what the
// assignments name (see Buckets).
package backup

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strings"
	"time"

	"mesh.dev/internal/natsx"
)

// Format names the archive layout; a reader refuses any other.
const Format = "mesh-backup/1"

// Names of the archive's fixed files.
const (
	headerFile      = "mesh-backup.json"
	manifestFile    = "manifest.json"
	manifestSumFile = "manifest.json.sha256"
)

// Kinds of bucket.
const (
	KindKV     = "kv"
	KindObject = "object"
)

// Operations of a KV record, as nats.go names them.
const (
	OpPut   = "PUT"
	OpDel   = "DEL"
	OpPurge = "PURGE"
)

// maxMetaSize bounds a record's JSON file: headers are small, and a reader
// must not be made to buffer an arbitrary amount.
const maxMetaSize = 1 << 20

// maxKVValue bounds a KV value in the archive: a bucket's stream allows the
// value limit plus room for headers.
const maxKVValue = natsx.MaxValueSize + natsx.MaxHeaderBytes

// Buckets are the buckets and stores an archive holds, in the order a
// backup reads them: whatever refers to something is read before what it
// refers to (assignments name compositions and fingerprints, compositions
// name objects, registrations name entries, builds name artifacts).
// Entries, builds and artifacts are only ever added, so everything an
// archived record names is in the archive too.
//
// The truth of DESIGN.md §9 is held whole. Of the derived compositions and
// objects it holds only those the archived assignments' wants name (and
// the objects those compositions name): the composer composes each module
// at its registered fingerprint only, so a want it holds at another one (a
// move held for approval) names a composition no pass rebuilds, and without
// it the restored assignment would lose that module.
var Buckets = []string{
	natsx.BucketAssignments,
	natsx.BucketCompositions,
	natsx.ObjectStoreObjects,
	natsx.BucketApprovals,
	natsx.BucketNodes,
	natsx.BucketKeysets,
	natsx.BucketCatalogModules,
	natsx.BucketCatalogBuilds,
	natsx.BucketCatalogEntries,
	natsx.ObjectStoreArtifacts,
}

// wantedOnly reports whether an archive holds only the part of a bucket
// that the assignments name.
func wantedOnly(bucket string) bool {
	return bucket == natsx.BucketCompositions || bucket == natsx.ObjectStoreObjects
}

// restoreOrder is the reverse: what is referred to is restored first, so a
// service that reads during a restore never sees a reference to a record
// that is not there yet.
func restoreOrder() []string {
	out := slices.Clone(Buckets)
	slices.Reverse(out)
	return out
}

func kindOf(bucket string) string {
	if bucket == natsx.ObjectStoreArtifacts || bucket == natsx.ObjectStoreObjects {
		return KindObject
	}
	return KindKV
}

// Source describes the server a backup was read from.
type Source struct {
	URL     string `json:"url,omitempty"`
	Server  string `json:"server,omitempty"`
	Version string `json:"version,omitempty"`
	Cluster string `json:"cluster,omitempty"`
}

// Header is the archive's first file.
type Header struct {
	Format    string    `json:"format"`
	StartedAt time.Time `json:"started_at"`
	Source    Source    `json:"source"`
	Buckets   []string  `json:"buckets"`
}

// BucketConfig is what the source's stream was configured with, for the
// record and as the default replica count of a restore.
type BucketConfig struct {
	Replicas     int    `json:"replicas"`
	Storage      string `json:"storage"`
	History      int64  `json:"history,omitempty"`
	MaxValueSize int32  `json:"max_value_size,omitempty"`
	Description  string `json:"description,omitempty"`
}

// BucketSummary counts what the archive holds of one bucket or store.
type BucketSummary struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Absent is set when the source had no such bucket; the archive then
	// holds none of its records and a restore creates it empty.
	Absent bool          `json:"absent,omitempty"`
	Config *BucketConfig `json:"config,omitempty"`
	// Records is the number of KV messages or objects.
	Records int `json:"records"`
	// Keys is the number of distinct keys (objects: names).
	Keys int `json:"keys"`
	// Markers counts the delete and purge markers among the records.
	Markers int `json:"markers,omitempty"`
	// Bytes is the sum of the values' or objects' sizes.
	Bytes int64 `json:"bytes"`
	// LastSequence is the highest source revision archived (objects: the
	// store's last stream sequence when its read ended).
	LastSequence uint64 `json:"last_sequence,omitempty"`
	// Selection says which part of the bucket the archive holds when it is
	// not the whole (compositions and objects: those the assignments name).
	Selection string `json:"selection,omitempty"`
	// Skipped names what was left out, with why (object links, objects
	// deleted while the backup ran).
	Skipped []string `json:"skipped,omitempty"`
}

// FileSum is one file of the archive.
type FileSum struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest is the archive's table of contents, written last.
type Manifest struct {
	Format     string          `json:"format"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Source     Source          `json:"source"`
	Buckets    []BucketSummary `json:"buckets"`
	Files      []FileSum       `json:"files"`
}

// Bucket returns the summary of a bucket, or nil.
func (m *Manifest) Bucket(name string) *BucketSummary {
	for i := range m.Buckets {
		if m.Buckets[i].Name == name {
			return &m.Buckets[i]
		}
	}
	return nil
}

// Record is one KV message: the file kv/<bucket>/<n>.json, followed by its
// value in kv/<bucket>/<n>.value.
type Record struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Op is PUT for a value, DEL or PURGE for a marker.
	Op string `json:"op"`
	// Revision and Created are the source's stream sequence and server
	// timestamp, for the record; a restore gets new ones.
	Revision uint64    `json:"revision"`
	Created  time.Time `json:"created"`
	// Headers are the message's headers as stored, the writer's trace
	// context among them.
	Headers map[string][]string `json:"headers,omitempty"`
	Size    int64               `json:"size"`
	SHA256  string              `json:"sha256"`
}

// Object is one object of an object store: the file
// objects/<store>/<n>.json, followed by its content in
// objects/<store>/<n>.data.
type Object struct {
	Store       string              `json:"store"`
	Name        string              `json:"name"`
	Description string              `json:"description,omitempty"`
	Headers     map[string][]string `json:"headers,omitempty"`
	Metadata    map[string]string   `json:"metadata,omitempty"`
	ChunkSize   uint32              `json:"chunk_size,omitempty"`
	Modified    time.Time           `json:"modified"`
	Size        int64               `json:"size"`
	SHA256      string              `json:"sha256"`
	// NATSDigest is the object store's own digest ("SHA-256=" and the
	// base64url sum), which a restore compares with the one it gets.
	NATSDigest string `json:"nats_digest"`
}

// natsDigestHex turns the object store's digest notation into hex.
func natsDigestHex(d string) (string, error) {
	b64, ok := strings.CutPrefix(d, "SHA-256=")
	if !ok {
		return "", fmt.Errorf("object digest %q is not SHA-256", d)
	}
	sum, err := base64.URLEncoding.DecodeString(b64)
	if err != nil {
		sum, err = base64.RawURLEncoding.DecodeString(b64)
	}
	if err != nil || len(sum) != sha256.Size {
		return "", fmt.Errorf("object digest %q does not decode", d)
	}
	return hex.EncodeToString(sum), nil
}

func recordPath(bucket string, n int, ext string) string {
	return fmt.Sprintf("kv/%s/%08d.%s", bucket, n, ext)
}

func objectPath(store string, n int, ext string) string {
	return fmt.Sprintf("objects/%s/%08d.%s", store, n, ext)
}

// archiveWriter writes the tar and keeps the list of its files.
type archiveWriter struct {
	tw      *tar.Writer
	modTime time.Time
	files   []FileSum
}

func newArchiveWriter(w io.Writer, modTime time.Time) *archiveWriter {
	return &archiveWriter{tw: tar.NewWriter(w), modTime: modTime.UTC().Truncate(time.Second)}
}

// put writes one file of exactly size bytes read from r. When want is set,
// the bytes must have that sha256, or the write fails (and with it the
// backup: the tar is then unusable, which is what the caller wants of a
// source that changed under it).
func (a *archiveWriter) put(name string, size int64, r io.Reader, want string) (string, error) {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, ModTime: a.modTime}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return "", fmt.Errorf("archive %s: %w", name, err)
	}
	h := sha256.New()
	n, err := io.Copy(a.tw, io.TeeReader(io.LimitReader(r, size), h))
	if err != nil {
		return "", fmt.Errorf("archive %s: %w", name, err)
	}
	if n != size {
		return "", fmt.Errorf("archive %s: %d of %d bytes came", name, n, size)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && sum != want {
		return "", fmt.Errorf("archive %s: the bytes read have sha256 %s, %s expected", name, sum, want)
	}
	a.files = append(a.files, FileSum{Name: name, Size: size, SHA256: sum})
	return sum, nil
}

func (a *archiveWriter) putBytes(name string, b []byte) error {
	_, err := a.put(name, int64(len(b)), bytes.NewReader(b), "")
	return err
}

func (a *archiveWriter) putJSON(name string, v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	return b, a.putBytes(name, b)
}

// finish writes the manifest and its sum, and closes the tar.
func (a *archiveWriter) finish(m *Manifest) error {
	m.Files = a.files
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := a.putBytes(manifestFile, b); err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if err := a.putBytes(manifestSumFile, []byte(hex.EncodeToString(sum[:])+"  "+manifestFile+"\n")); err != nil {
		return err
	}
	return a.tw.Close()
}

// CorruptError says what is wrong with an archive.
type CorruptError struct {
	File string
	Err  error
}

func (e *CorruptError) Error() string {
	if e.File == "" {
		return "archive is corrupt: " + e.Err.Error()
	}
	return fmt.Sprintf("archive is corrupt at %s: %v", e.File, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

func corrupt(file string, format string, args ...any) error {
	return &CorruptError{File: file, Err: fmt.Errorf(format, args...)}
}

// checkedReader yields a file's bytes and fails at their end unless they
// were exactly size bytes with the sha256 want.
type checkedReader struct {
	name string
	r    io.Reader
	h    hash.Hash
	n    int64
	size int64
	want string
	done bool
	err  error // of the check at the end
}

func newCheckedReader(name string, r io.Reader, size int64, want string) *checkedReader {
	return &checkedReader{name: name, r: r, h: sha256.New(), size: size, want: want}
}

func (c *checkedReader) Read(p []byte) (int, error) {
	if c.done {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if errors.Is(err, io.EOF) {
		if cerr := c.check(); cerr != nil {
			return n, cerr
		}
	} else if err != nil {
		err = corrupt(c.name, "%w", err)
	}
	return n, err
}

func (c *checkedReader) check() error {
	c.done = true
	if c.n != c.size {
		c.err = corrupt(c.name, "%d bytes, %d recorded", c.n, c.size)
	} else if sum := hex.EncodeToString(c.h.Sum(nil)); sum != c.want {
		c.err = corrupt(c.name, "sha256 %s, %s recorded", sum, c.want)
	}
	return c.err
}

// drain reads what is left and returns the outcome of the check at the
// end (a reader such as io.ReadFull may have dropped it).
func (c *checkedReader) drain() error {
	if !c.done {
		if _, err := io.Copy(io.Discard, c); err != nil {
			return err
		}
	}
	return c.err
}

// entry is one record of the archive as the scanner hands it out: a KV
// record with its value, or an object with a reader of its content.
type entry struct {
	index   int
	record  *Record
	value   []byte
	object  *Object
	content *checkedReader
}

// scanner reads an archive in order and checks its structure as it goes.
type scanner struct {
	tr *tar.Reader
	// files lists every file read, with its size and sha256, when sums is
	// set (Verify); a restore pass skips what it does not restore.
	files  []FileSum
	sums   bool
	header *Header
	// bucket and due track the section being read: its records are
	// numbered from 1 without gaps.
	bucket string
	due    int
	seen   map[string]bool
	// pending is a header read ahead of the entry it starts.
	pending *tar.Header
}

func newScanner(r io.Reader, sums bool) *scanner {
	return &scanner{tr: tar.NewReader(r), sums: sums, seen: map[string]bool{}}
}

func (s *scanner) nextHeader() (*tar.Header, error) {
	if h := s.pending; h != nil {
		s.pending = nil
		return h, nil
	}
	h, err := s.tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		return nil, corrupt("", "%w", err)
	}
	if h.Typeflag != tar.TypeReg {
		return nil, corrupt(h.Name, "not a regular file (type %q)", h.Typeflag)
	}
	if h.Size < 0 {
		return nil, corrupt(h.Name, "negative size")
	}
	return h, nil
}

// readSmall reads a whole small file and records its sum.
func (s *scanner) readSmall(h *tar.Header, limit int64) ([]byte, error) {
	if h.Size > limit {
		return nil, corrupt(h.Name, "%d bytes, over the limit of %d", h.Size, limit)
	}
	b := make([]byte, h.Size)
	if _, err := io.ReadFull(s.tr, b); err != nil {
		return nil, corrupt(h.Name, "%w", err)
	}
	if s.sums {
		sum := sha256.Sum256(b)
		s.files = append(s.files, FileSum{Name: h.Name, Size: h.Size, SHA256: hex.EncodeToString(sum[:])})
	}
	return b, nil
}

func decodeStrict(name string, b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return corrupt(name, "does not decode: %w", err)
	}
	if dec.More() {
		return corrupt(name, "trailing data")
	}
	return nil
}

// readHeader reads the archive's first file.
func (s *scanner) readHeader() (*Header, error) {
	h, err := s.nextHeader()
	if errors.Is(err, io.EOF) {
		return nil, corrupt("", "empty archive")
	}
	if err != nil {
		return nil, err
	}
	if h.Name != headerFile {
		return nil, corrupt(h.Name, "the first file is not %s: not a mesh backup", headerFile)
	}
	b, err := s.readSmall(h, maxMetaSize)
	if err != nil {
		return nil, err
	}
	hd := &Header{}
	if err := decodeStrict(h.Name, b, hd); err != nil {
		return nil, err
	}
	if hd.Format != Format {
		return nil, corrupt(h.Name, "format %q, this meshctl reads %q", hd.Format, Format)
	}
	s.header = hd
	return hd, nil
}

// parsePath splits kv/<bucket>/<n>.<ext> or objects/<store>/<n>.<ext>.
func parsePath(name string) (kind, bucket string, n int, ext string, ok bool) {
	parts := strings.Split(name, "/")
	if len(parts) != 3 {
		return "", "", 0, "", false
	}
	switch parts[0] {
	case "kv":
		kind = KindKV
	case "objects":
		kind = KindObject
	default:
		return "", "", 0, "", false
	}
	base, ext, found := strings.Cut(parts[2], ".")
	if !found || len(base) != 8 {
		return "", "", 0, "", false
	}
	for _, c := range base {
		if c < '0' || c > '9' {
			return "", "", 0, "", false
		}
		n = n*10 + int(c-'0')
	}
	return kind, parts[1], n, ext, true
}

// next returns the next record, or the manifest's tar header (and a nil
// entry) when the records end. With skip set for a bucket, its records are
// passed over without being read (a restore pass of another bucket).
func (s *scanner) next(skip func(bucket string) bool) (*entry, *tar.Header, error) {
	h, err := s.nextHeader()
	if errors.Is(err, io.EOF) {
		return nil, nil, corrupt("", "the archive ends without %s: it is cut short", manifestFile)
	}
	if err != nil {
		return nil, nil, err
	}
	if h.Name == manifestFile {
		return nil, h, nil
	}
	kind, bucket, n, ext, ok := parsePath(h.Name)
	if !ok || ext != "json" {
		return nil, nil, corrupt(h.Name, "unexpected file")
	}
	if !slices.Contains(Buckets, bucket) || kindOf(bucket) != kind {
		return nil, nil, corrupt(h.Name, "%s is not a bucket a backup holds", bucket)
	}
	if bucket != s.bucket {
		if s.seen[bucket] {
			return nil, nil, corrupt(h.Name, "the records of %s are not together", bucket)
		}
		s.seen[bucket] = true
		s.bucket, s.due = bucket, 1
	}
	if n != s.due {
		return nil, nil, corrupt(h.Name, "record %d where %d was due", n, s.due)
	}
	s.due++
	contentExt := "value"
	pathOf := recordPath
	if kind == KindObject {
		contentExt, pathOf = "data", objectPath
	}
	contentName := pathOf(bucket, n, contentExt)
	skipping := skip != nil && skip(bucket)

	if skipping && !s.sums {
		// Pass over both files without reading them (the tar reader seeks
		// when it can).
		ch, err := s.nextHeader()
		if err != nil {
			return nil, nil, err
		}
		if ch.Name != contentName {
			return nil, nil, corrupt(ch.Name, "%s was due", contentName)
		}
		return &entry{index: n}, nil, nil
	}

	meta, err := s.readSmall(h, maxMetaSize)
	if err != nil {
		return nil, nil, err
	}
	e := &entry{index: n}
	var size int64
	var sum string
	if kind == KindKV {
		r := &Record{}
		if err := decodeStrict(h.Name, meta, r); err != nil {
			return nil, nil, err
		}
		if err := checkRecord(bucket, r); err != nil {
			return nil, nil, corrupt(h.Name, "%w", err)
		}
		e.record, size, sum = r, r.Size, r.SHA256
	} else {
		o := &Object{}
		if err := decodeStrict(h.Name, meta, o); err != nil {
			return nil, nil, err
		}
		if err := checkObject(bucket, o); err != nil {
			return nil, nil, corrupt(h.Name, "%w", err)
		}
		e.object, size, sum = o, o.Size, o.SHA256
	}

	ch, err := s.nextHeader()
	if errors.Is(err, io.EOF) {
		return nil, nil, corrupt(contentName, "missing: the archive is cut short")
	}
	if err != nil {
		return nil, nil, err
	}
	if ch.Name != contentName {
		return nil, nil, corrupt(ch.Name, "%s was due", contentName)
	}
	if ch.Size != size {
		return nil, nil, corrupt(ch.Name, "%d bytes, %d recorded in %s", ch.Size, size, h.Name)
	}
	e.content = newCheckedReader(ch.Name, s.tr, size, sum)
	if kind == KindKV && !skipping {
		v := make([]byte, size)
		if _, err := io.ReadFull(e.content, v); err != nil {
			return nil, nil, corrupt(ch.Name, "%w", err)
		}
		if err := e.content.drain(); err != nil {
			return nil, nil, err
		}
		e.value = v
	}
	if s.sums {
		s.files = append(s.files, FileSum{Name: ch.Name, Size: size, SHA256: sum})
	}
	if skipping {
		// Verify: read and check what is not delivered.
		if err := e.content.drain(); err != nil {
			return nil, nil, err
		}
		return &entry{index: n}, nil, nil
	}
	return e, nil, nil
}

func checkRecord(bucket string, r *Record) error {
	if r.Bucket != bucket {
		return fmt.Errorf("record of bucket %q filed under %s", r.Bucket, bucket)
	}
	if !validKey(r.Key) {
		return fmt.Errorf("key %q is not a valid KV key", r.Key)
	}
	switch r.Op {
	case OpPut, OpDel, OpPurge:
	default:
		return fmt.Errorf("operation %q", r.Op)
	}
	if r.Size < 0 || r.Size > maxKVValue {
		return fmt.Errorf("value size %d outside 0..%d", r.Size, maxKVValue)
	}
	if !validHex(r.SHA256) {
		return fmt.Errorf("sha256 %q", r.SHA256)
	}
	return nil
}

func checkObject(store string, o *Object) error {
	if o.Store != store {
		return fmt.Errorf("object of store %q filed under %s", o.Store, store)
	}
	if o.Name == "" {
		return errors.New("object without a name")
	}
	if o.Size < 0 {
		return fmt.Errorf("negative size %d", o.Size)
	}
	if !validHex(o.SHA256) {
		return fmt.Errorf("sha256 %q", o.SHA256)
	}
	d, err := natsDigestHex(o.NATSDigest)
	if err != nil {
		return err
	}
	if d != o.SHA256 {
		return fmt.Errorf("object digest %s is not its sha256 %s", o.NATSDigest, o.SHA256)
	}
	return nil
}

func validHex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validKey is nats.go's rule for a KV key.
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for _, c := range key {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-/_=.", c)) {
			return false
		}
	}
	return true
}

// finishScan reads the manifest (whose tar header next returned) and its
// sum, and checks that nothing follows.
func (s *scanner) finishScan(h *tar.Header) (*Manifest, error) {
	b, err := s.readSmall(h, 1<<30)
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	if err := decodeStrict(manifestFile, b, m); err != nil {
		return nil, err
	}
	sh, err := s.nextHeader()
	if errors.Is(err, io.EOF) {
		return nil, corrupt(manifestSumFile, "missing: the archive is cut short")
	}
	if err != nil {
		return nil, err
	}
	if sh.Name != manifestSumFile {
		return nil, corrupt(sh.Name, "%s was due", manifestSumFile)
	}
	sb, err := s.readSmall(sh, 256)
	if err != nil {
		return nil, err
	}
	if s.sums {
		// The manifest lists neither itself nor its sum.
		s.files = s.files[:len(s.files)-2]
	}
	sum := sha256.Sum256(b)
	if want := hex.EncodeToString(sum[:]) + "  " + manifestFile + "\n"; string(sb) != want {
		return nil, corrupt(manifestFile, "its sha256 is %x, %s records %q", sum, manifestSumFile, strings.TrimSpace(string(sb)))
	}
	if extra, err := s.nextHeader(); err == nil {
		return nil, corrupt(extra.Name, "a file after %s", manifestSumFile)
	} else if !errors.Is(err, io.EOF) {
		return nil, err
	}
	if m.Format != Format {
		return nil, corrupt(manifestFile, "format %q, %q expected", m.Format, Format)
	}
	return m, nil
}
