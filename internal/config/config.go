// Package config loads service configuration files strictly: an unknown key
// or a malformed value fails at start, naming the key, so a typo never runs
// silently with a default.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"
)

// Load decodes the YAML (or JSON) file at path into dst, refusing unknown
// keys. An empty path leaves dst as it is.
func Load(path string, dst any) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Duration is a time.Duration that reads and writes as "24h".
type Duration time.Duration

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (e.g. 24h, 90s)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// String returns the duration as Go writes it.
func (d Duration) String() string { return time.Duration(d).String() }

// Set parses a flag value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Strings is a repeatable string flag.
type Strings []string

// String joins the values.
func (s *Strings) String() string { return fmt.Sprint([]string(*s)) }

// Set appends a value.
func (s *Strings) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// Required returns an error naming the first field whose value is empty.
func Required(fields ...[2]string) error {
	for _, f := range fields {
		if f[1] == "" {
			return fmt.Errorf("config: %s is required", f[0])
		}
	}
	return nil
}
