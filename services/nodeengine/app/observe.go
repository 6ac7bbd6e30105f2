package app

import (
	typev1 "mesh.dev/proto/mesh/type/v1"
	"mesh.dev/services/nodeengine/internal/state"
)

// Committed is what the engine made durable in one state write that changes
// what it runs or trusts: the applied manifest and compositions of an apply,
// or a keyset it took. The fault harness records every one and checks it
// apart from the engine (signatures, node, expiry, digests).
type Committed struct {
	// Manifest is the manifest that became applied, nil when the apply
	// kept the applied one.
	Manifest *typev1.Envelope
	// Compositions became the applied composition of their module.
	Compositions map[string]*typev1.Envelope
	// Drop lists modules whose applied composition went.
	Drop []string
	// Keyset is a keyset the engine took (persisted before use).
	Keyset *typev1.Envelope
}

// observed calls fn after each durable commit or keyset write of the store
// it wraps, never for one that failed.
type observed struct {
	state.Store
	fn func(Committed)
}

func (o observed) Commit(c *state.Commit) error {
	if err := o.Store.Commit(c); err != nil {
		return err
	}
	if c.Manifest != nil || len(c.Compositions) > 0 || len(c.Drop) > 0 {
		o.fn(Committed{Manifest: c.Manifest, Compositions: c.Compositions, Drop: c.Drop})
	}
	return nil
}

func (o observed) PutKeyset(env *typev1.Envelope) error {
	if err := o.Store.PutKeyset(env); err != nil {
		return err
	}
	o.fn(Committed{Keyset: env})
	return nil
}

func (o observed) PutKeysetAndMarks(env *typev1.Envelope, hw state.HighWater) error {
	if err := o.Store.PutKeysetAndMarks(env, hw); err != nil {
		return err
	}
	o.fn(Committed{Keyset: env})
	return nil
}
