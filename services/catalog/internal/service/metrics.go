package service

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/status"
)

// metrics are the catalog's own instruments; otelgrpc already counts and
// times every RPC.
type metrics struct {
	entries       metric.Int64Counter
	builds        metric.Int64Counter
	artifacts     metric.Int64Counter
	artifactBytes metric.Int64Counter
	servedBytes   metric.Int64Counter
	registrations metric.Int64Counter
	refusals      metric.Int64Counter
	watches       metric.Int64UpDownCounter
}

func newMetrics(mp metric.MeterProvider) metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(TracerName)
	var out metrics
	// Instrument creation fails only for invalid names, which these are not;
	// a failed one is a no-op instrument.
	out.entries, _ = m.Int64Counter("mesh_catalog_entries_created", metric.WithDescription("Entries stored (no-op puts not counted)."))
	out.builds, _ = m.Int64Counter("mesh_catalog_builds_recorded", metric.WithDescription("Builds recorded, by state."))
	out.artifacts, _ = m.Int64Counter("mesh_catalog_artifacts_stored", metric.WithDescription("Artifacts stored (deduplicated uploads not counted)."))
	out.artifactBytes, _ = m.Int64Counter("mesh_catalog_artifact_bytes_stored", metric.WithUnit("By"), metric.WithDescription("Bytes of artifacts stored."))
	out.servedBytes, _ = m.Int64Counter("mesh_catalog_artifact_bytes_served", metric.WithUnit("By"), metric.WithDescription("Bytes of artifacts downloaded."))
	out.registrations, _ = m.Int64Counter("mesh_catalog_registrations", metric.WithDescription("Module registrations that changed a module's fingerprint."))
	out.refusals, _ = m.Int64Counter("mesh_catalog_refusals", metric.WithDescription("Requests answered with an error, by method and code."))
	out.watches, _ = m.Int64UpDownCounter("mesh_catalog_watch_streams", metric.WithDescription("WatchModules streams open."))
	return out
}

func (m metrics) refused(ctx context.Context, method string, err error) {
	m.refusals.Add(ctx, 1, metric.WithAttributes(attribute.String("method", method), attribute.String("code", status.Code(err).String())))
}
