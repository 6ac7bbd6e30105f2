#!/bin/sh
# Publishes every example module to the catalog: entry, artifacts, DONE
# build and registration, as a builder. Run it again and nothing changes.
#
#   examples/modules/publish.sh [meshctl flags...]
#
# The catalog address and certificates come from meshctl's flags or the
# MESH_CATALOG, MESH_CERTS_DIR and MESH_IDENTITY variables (default identity
# here: builder-ci, made by `meshctl certs init`).
set -eu
cd "$(dirname "$0")/../.."
MESHCTL=${MESHCTL:-}
if [ -z "$MESHCTL" ]; then
	if [ -x ./bin/meshctl ]; then
		MESHCTL=./bin/meshctl
	else
		MESHCTL="go run ./cmd/meshctl"
	fi
fi
# shellcheck disable=SC2086 # MESHCTL may be a command with arguments
exec $MESHCTL --identity "${MESH_IDENTITY:-builder-ci}" catalog publish "$@" examples/modules/*/
