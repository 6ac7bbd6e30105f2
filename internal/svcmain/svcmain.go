// Package svcmain is what every service's main does once its configuration
// is read and valid: telemetry from the OTEL_* variables (with Prometheus
// metrics on their own listener), a context that ends on SIGINT or SIGTERM,
// then the service until that context ends, and telemetry flushed last.
package svcmain

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"mesh.dev/internal/telemetry"
)

// Serve runs a service. metricsAddr "" serves no metrics.
func Serve(service, version, metricsAddr string, run func(ctx context.Context, tel *telemetry.Telemetry) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: service, ServiceVersion: version, MetricsAddr: metricsAddr, Global: true})
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer tel.Shutdown(context.Background())
	return run(ctx, tel)
}

// Override sets *dst to v when a flag gave v.
func Override(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}
