package backup

import (
	"fmt"
	"io"
	"slices"
)

// Verify reads a whole archive and checks it, without connecting to
// anything: the first file names the format; every record's file decodes
// and is followed by its value or content, whose size and sha256 are the
// ones the record states (an object's also its object-store digest); records
// are numbered without gaps and each bucket's are together; the manifest
// lists exactly the files read, in order, with their sizes and sums, counts
// exactly the records read, and covers every bucket of Buckets; its own sha256 is
// the one in manifest.json.sha256, and nothing follows. It returns the
// manifest, or a *CorruptError naming the first file that is wrong.
func Verify(r io.Reader) (*Manifest, error) {
	s := newScanner(r, true)
	hd, err := s.readHeader()
	if err != nil {
		return nil, err
	}
	counted := map[string]*BucketSummary{}
	keys := map[string]map[string]bool{}
	for {
		e, mh, err := s.next(nil)
		if err != nil {
			return nil, err
		}
		if mh != nil {
			m, err := s.finishScan(mh)
			if err != nil {
				return nil, err
			}
			if err := checkManifest(hd, m, s.files, counted); err != nil {
				return nil, err
			}
			return m, nil
		}
		b := counted[s.bucket]
		if b == nil {
			b = &BucketSummary{Name: s.bucket}
			counted[s.bucket] = b
			keys[s.bucket] = map[string]bool{}
		}
		b.Records++
		if e.record != nil {
			keys[s.bucket][e.record.Key] = true
			if e.record.Op != OpPut {
				b.Markers++
			}
			b.Bytes += e.record.Size
		} else {
			if keys[s.bucket][e.object.Name] {
				return nil, corrupt(objectPath(s.bucket, e.index, "json"), "object %s is in the archive twice", e.object.Name)
			}
			keys[s.bucket][e.object.Name] = true
			b.Bytes += e.object.Size
			if err := e.content.drain(); err != nil {
				return nil, err
			}
		}
		b.Keys = len(keys[s.bucket])
	}
}

func checkManifest(hd *Header, m *Manifest, files []FileSum, counted map[string]*BucketSummary) error {
	if !m.StartedAt.Equal(hd.StartedAt) {
		return corrupt(manifestFile, "started at %s, %s says %s", m.StartedAt, headerFile, hd.StartedAt)
	}
	if len(m.Files) != len(files) {
		return corrupt(manifestFile, "lists %d files, the archive holds %d", len(m.Files), len(files))
	}
	for i, f := range files {
		if m.Files[i] != f {
			return corrupt(f.Name, "size %d sha256 %s; the manifest lists %s with size %d sha256 %s",
				f.Size, f.SHA256, m.Files[i].Name, m.Files[i].Size, m.Files[i].SHA256)
		}
	}
	var names []string
	for _, b := range m.Buckets {
		if slices.Contains(names, b.Name) {
			return corrupt(manifestFile, "bucket %s is listed twice", b.Name)
		}
		names = append(names, b.Name)
		if !slices.Contains(Buckets, b.Name) {
			return corrupt(manifestFile, "bucket %s is not one a backup holds", b.Name)
		}
		if b.Kind != kindOf(b.Name) {
			return corrupt(manifestFile, "bucket %s is of kind %q, %q expected", b.Name, b.Kind, kindOf(b.Name))
		}
		c := counted[b.Name]
		if c == nil {
			c = &BucketSummary{}
		}
		if b.Records != c.Records || b.Keys != c.Keys || b.Markers != c.Markers || b.Bytes != c.Bytes {
			return corrupt(manifestFile, "bucket %s: %d records, %d keys, %d markers, %d bytes listed; the archive holds %d, %d, %d, %d",
				b.Name, b.Records, b.Keys, b.Markers, b.Bytes, c.Records, c.Keys, c.Markers, c.Bytes)
		}
	}
	for _, want := range Buckets {
		if !slices.Contains(names, want) {
			return corrupt(manifestFile, "bucket %s is missing", want)
		}
	}
	for name := range counted {
		if !slices.Contains(names, name) {
			return corrupt(manifestFile, "records of %s are not counted", name)
		}
	}
	return nil
}

// Describe writes a summary of a manifest, one line per bucket.
func Describe(w io.Writer, m *Manifest) {
	fmt.Fprintf(w, "format %s, taken %s .. %s", m.Format, m.StartedAt.UTC().Format("2006-01-02T15:04:05Z"), m.FinishedAt.UTC().Format("2006-01-02T15:04:05Z"))
	if m.Source.URL != "" || m.Source.Server != "" {
		fmt.Fprintf(w, " from %s", m.Source.URL)
		if m.Source.Server != "" {
			fmt.Fprintf(w, " (server %s %s", m.Source.Server, m.Source.Version)
			if m.Source.Cluster != "" {
				fmt.Fprintf(w, ", cluster %s", m.Source.Cluster)
			}
			fmt.Fprint(w, ")")
		}
	}
	fmt.Fprintln(w)
	for _, b := range m.Buckets {
		unit := "records"
		if b.Kind == KindObject {
			unit = "objects"
		}
		line := fmt.Sprintf("  %-16s %6d %s %6d keys %10s", b.Name, b.Records, unit, b.Keys, Bytes(b.Bytes))
		if b.Markers > 0 {
			line += fmt.Sprintf("  (%d delete markers)", b.Markers)
		}
		if b.Absent {
			line += "  (absent in the source)"
		}
		fmt.Fprintln(w, line)
		for _, s := range b.Skipped {
			fmt.Fprintf(w, "    skipped: %s\n", s)
		}
	}
}

// Bytes formats a byte count.
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
