package app_test

import (
	"os"
	"testing"

	"go.opentelemetry.io/otel"

	"mesh.dev/internal/telemetry"

	"mesh.dev/services/composer/internal/composertest"
)

// TestMain lets the test binary run as a child composer process (see
// composertest.StartChild) for the kill and lease tests.
func TestMain(m *testing.M) {
	// The binaries set the mesh's propagator globally (telemetry.Setup);
	// otelgrpc reads it to carry trace context across gRPC calls.
	otel.SetTextMapPropagator(telemetry.Propagator())
	composertest.RunChildIfAsked()
	os.Exit(m.Run())
}
