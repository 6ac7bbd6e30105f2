// Package audit keeps the signer's hash-chained audit log: one JSON line per
// record, each fsynced before the operation it records goes on, each holding
// the hash of the one before, so a removed, reordered or edited record breaks
// the chain at a place Verify names.
package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Kinds of record.
const (
	// KindRequest is written before anything of a request is signed.
	KindRequest = "request"
	// KindSigned is written after the request's signatures are made and
	// before they are returned.
	KindSigned = "signed"
	// KindRefused records a request refused after its request record.
	KindRefused = "refused"
	// KindFence records a new fencing epoch.
	KindFence = "fence"
	// KindStart records a signer start and the key it signs with.
	KindStart = "start"
)

// genesis is the prev hash of the first record.
const genesis = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// Item is one signed (or to be signed) item.
type Item struct {
	// Digest of the canonical bytes.
	Digest string `json:"digest"`
	// Key is the composition key or the node of a manifest.
	Key string `json:"key,omitempty"`
	// Revision is a manifest's assigned revision.
	Revision uint64 `json:"revision,omitempty"`
}

// Record is one line of the log.
type Record struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Prev   string    `json:"prev"`
	Kind   string    `json:"kind"`
	Method string    `json:"method,omitempty"`
	Caller string    `json:"caller,omitempty"`
	Epoch  uint64    `json:"epoch,omitempty"`
	KeyID  string    `json:"key_id,omitempty"`
	// Request is the seq of the request record a signed/refused record
	// answers.
	Request uint64 `json:"request,omitempty"`
	Items   []Item `json:"items,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// TraceID ties the record to the request's trace.
	TraceID string `json:"trace_id,omitempty"`
	Hash    string `json:"hash"`
}

// hashOf returns the chain hash of a record: sha256 of its JSON with the hash
// field empty. Go's encoding of a struct is deterministic, so Verify gets the
// same bytes back from a parsed record.
func hashOf(r Record) (string, error) {
	r.Hash = ""
	b, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Log appends records to an audit file. It is safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	seq  uint64
	prev string
	// end is the file's size after the last acknowledged record.
	end int64
	// broken is set when a failed append may have left bytes after end
	// that could not be cut off: appending after them would break the
	// chain, so every later append fails until the signer restarts (and
	// Open cuts or keeps what is there).
	broken error
	now    func() time.Time
}

// Open opens (or creates) the log at path, verifies the chain and positions
// after the last record. A torn last line — a write the signer never
// acknowledged because it crashed before the fsync returned — is cut off, and
// reported in torn.
func Open(path string) (l *Log, torn bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("open audit log: %w", err)
	}
	res, err := scan(f)
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("audit log %s: %w", path, err)
	}
	if res.tornAt >= 0 {
		if err := f.Truncate(res.tornAt); err != nil {
			f.Close()
			return nil, false, fmt.Errorf("cut torn audit record: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, false, err
		}
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, false, err
	}
	return &Log{f: f, seq: res.last.Seq, prev: res.prev, end: end, now: time.Now}, res.tornAt >= 0, nil
}

// Append fills in seq, time, prev and hash, writes the record and fsyncs it.
// The record is acknowledged only when Append returns nil.
func (l *Log) Append(r Record) (Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return Record{}, errors.New("audit log is closed")
	}
	if l.broken != nil {
		return Record{}, fmt.Errorf("audit log refuses appends after an earlier failure (restart the signer): %w", l.broken)
	}
	r.Seq = l.seq + 1
	r.Time = l.now().UTC()
	r.Prev = l.prev
	h, err := hashOf(r)
	if err != nil {
		return Record{}, err
	}
	r.Hash = h
	b, err := json.Marshal(r)
	if err != nil {
		return Record{}, err
	}
	b = append(b, '\n')
	if _, err := l.f.Write(b); err != nil {
		err = fmt.Errorf("write audit record: %w", err)
		l.cut(err)
		return Record{}, err
	}
	if err := l.f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty
		// pages and cleared the error: what is on disk is unknown, so
		// nothing more is appended in this process.
		err = fmt.Errorf("fsync audit record: %w", err)
		l.broken = err
		return Record{}, err
	}
	l.seq, l.prev = r.Seq, r.Hash
	l.end += int64(len(b))
	return r, nil
}

// cut removes what a failed write may have left after the last acknowledged
// record, so the next record follows it; when that fails too the log stops
// taking appends.
func (l *Log) cut(cause error) {
	if err := l.f.Truncate(l.end); err != nil {
		l.broken = fmt.Errorf("%w; cutting it off failed: %v", cause, err)
		return
	}
	if _, err := l.f.Seek(l.end, io.SeekStart); err != nil {
		l.broken = fmt.Errorf("%w; seeking back failed: %v", cause, err)
		return
	}
	if err := l.f.Sync(); err != nil {
		l.broken = fmt.Errorf("%w; fsync after cutting it off failed: %v", cause, err)
	}
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Report is what Verify found.
type Report struct {
	Records int
	Last    Record
	// Torn is set when the last line is an unfinished write (never
	// acknowledged); it does not break the chain.
	Torn bool
}

// BreakError says where the chain breaks.
type BreakError struct {
	Line   int
	Seq    uint64
	Reason string
}

func (e *BreakError) Error() string {
	return fmt.Sprintf("chain breaks at line %d (seq %d): %s", e.Line, e.Seq, e.Reason)
}

// Verify reads the log at path and checks every record's seq, prev and hash;
// the error is a *BreakError naming the line where the chain breaks.
func Verify(path string) (Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	res, err := scan(f)
	if err != nil {
		return Report{}, err
	}
	return Report{Records: res.records, Last: res.last, Torn: res.tornAt >= 0}, nil
}

type scanResult struct {
	records int
	last    Record
	prev    string
	// tornAt is the offset of an unfinished last line, or -1.
	tornAt int64
}

func scan(r io.Reader) (scanResult, error) {
	res := scanResult{prev: genesis, tornAt: -1}
	br := bufio.NewReaderSize(r, 1<<20)
	var off int64
	line := 0
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
			// No newline: the write of this record never completed.
			res.tornAt = off
			return res, nil
		}
		if len(b) > 0 {
			line++
			var rec Record
			if jerr := json.Unmarshal(b, &rec); jerr != nil {
				return res, &BreakError{Line: line, Seq: res.last.Seq + 1, Reason: "not a record: " + jerr.Error()}
			}
			if rec.Seq != res.last.Seq+1 {
				return res, &BreakError{Line: line, Seq: rec.Seq, Reason: fmt.Sprintf("seq %d follows %d", rec.Seq, res.last.Seq)}
			}
			if rec.Prev != res.prev {
				return res, &BreakError{Line: line, Seq: rec.Seq, Reason: "prev is not the hash of the record before"}
			}
			h, herr := hashOf(rec)
			if herr != nil {
				return res, herr
			}
			if h != rec.Hash {
				return res, &BreakError{Line: line, Seq: rec.Seq, Reason: "the record's content does not match its hash"}
			}
			res.records++
			res.last = rec
			res.prev = rec.Hash
			off += int64(len(b))
		}
		if err == io.EOF {
			return res, nil
		}
		if err != nil {
			return res, err
		}
	}
}
