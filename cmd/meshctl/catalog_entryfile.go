package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"mesh.dev/internal/canonical"
	"mesh.dev/internal/lint"
	"mesh.dev/internal/names"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	typev1 "mesh.dev/proto/mesh/type/v1"
)

// readEntryFile reads an entry an operator wrote: the JSON form of a
// mesh.catalog.v1.Entry, or the same as YAML. Unknown fields are refused.
// "manifest" may be a mesh.type.v1.ModuleManifest object instead of base64
// canonical bytes; enum values may be given short (PASS, FILE, MANUAL); and
// manifest_digest, needs, artifacts' kinds and the fingerprint are computed
// when absent. Whatever is given is sent as given, for the catalog to check.
func readEntryFile(file string) (*catalogv1.Entry, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var doc any
	// YAML holds JSON, so one decoder reads both.
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	fields, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: not an object of entry fields", file)
	}
	var manifest *typev1.ModuleManifest
	if obj, ok := fields["manifest"].(map[string]any); ok {
		delete(fields, "manifest")
		manifest = &typev1.ModuleManifest{}
		if err := unmarshalFields(obj, manifest, manifestEnums); err != nil {
			return nil, fmt.Errorf("%s: manifest: %w", file, err)
		}
	}
	e := &catalogv1.Entry{}
	if err := unmarshalFields(fields, e, entryEnums); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if manifest != nil {
		if e.Manifest, err = canonical.Marshal(manifest); err != nil {
			return nil, err
		}
	}
	fillEntry(e)
	return e, nil
}

// Enum fields that may be given without their type prefix, by JSON name.
var (
	entryEnums    = map[string]string{"verdict": "VERDICT_"}
	manifestEnums = map[string]string{"type": "RESOURCE_TYPE_", "policy": "UPGRADE_POLICY_"}
)

// unmarshalFields decodes a generic object into m through protojson,
// prefixing short enum values first.
func unmarshalFields(fields map[string]any, m proto.Message, enums map[string]string) error {
	prefixEnums(fields, enums)
	js, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(js, m)
}

// prefixEnums walks v and prefixes the string values of the enum fields
// named in enums that lack their prefix.
func prefixEnums(v any, enums map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if prefix, ok := enums[k]; ok {
				if s, ok := x.(string); ok && s != "" && !strings.HasPrefix(strings.ToUpper(s), prefix) {
					v[k] = prefix + strings.ToUpper(s)
					continue
				}
			}
			prefixEnums(x, enums)
		}
	case []any:
		for _, x := range v {
			prefixEnums(x, enums)
		}
	}
}

// fillEntry computes what an operator may leave out.
func fillEntry(e *catalogv1.Entry) {
	m := &typev1.ModuleManifest{}
	decoded := len(e.GetManifest()) > 0 && canonical.Decode(e.GetManifest(), m) == nil
	if e.ManifestDigest == "" && len(e.GetManifest()) > 0 {
		e.ManifestDigest = names.Digest(e.GetManifest())
	}
	if decoded {
		if len(e.Needs) == 0 {
			e.Needs = m.GetNeeds()
		}
		if e.Module == "" {
			e.Module = m.GetModule()
		}
		if len(e.Artifacts) == 0 {
			for _, ref := range lint.ArtifactRefs(m) {
				e.Artifacts = append(e.Artifacts, &catalogv1.ArtifactDecl{Ref: ref})
			}
		}
	}
	for _, a := range e.Artifacts {
		if a.Kind == "" {
			a.Kind, _, _ = strings.Cut(a.GetRef(), ":")
		}
	}
	if e.Fingerprint == "" {
		e.Fingerprint = names.ComputeFingerprint(e.GetModule(), e.GetRepository(), e.GetPath(), e.GetSourceDigest(), e.GetManifestDigest())
	}
}
