#!/usr/bin/env bash
# Prints the Secrets and the trust ConfigMap of namespace mesh from a
# deployment directory made by deploy/compose/gen.sh, for kubectl apply:
#
#   deploy/compose/gen.sh --nodes "$(kubectl get nodes -o name | sed 's|node/||' | tr '\n' ' ')" /secure/mesh
#   deploy/k8s/secrets.sh /secure/mesh | kubectl apply -f -
#
# Secrets: nats-tls (the StatefulSet's certificate, naming all three
# servers), catalog-tls, signer-tls, composer-tls (composer-1's; both
# replicas mount it), signer-key (the online signing key), backup-tls (the
# read-only NATS user operator/backup of the backup CronJob; restore's
# certificate, which may write JetStream, stays out of the cluster). ConfigMap
# mesh-trust: ca.pem, roots.json, keyset.json (public). Node certificates
# are not here: each goes onto its machine (see nodeengine.yaml).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$1
b64() { base64 -w0 <"$1"; }
entries() { # entries DIR FILE...: "  FILE: <base64>" lines
	local d=$1; shift
	for f in "$@"; do printf '  %s: %s\n' "$f" "$(b64 "$d/$f")"; done
}
secret() { # secret NAME DIR FILE...
	local name=$1; shift
	cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: $name
  namespace: mesh
  labels:
    app.kubernetes.io/part-of: mesh
type: Opaque
data:
$(entries "$@")
YAML
}
secret nats-tls "$dir/nats-all/certs" ca.pem server.pem server-key.pem
secret catalog-tls "$dir/catalog" ca.pem catalog.pem catalog-key.pem
secret signer-tls "$dir/signer" ca.pem signer.pem signer-key.pem
secret composer-tls "$dir/composer-1" ca.pem composer.pem composer-key.pem
secret signer-key "$dir/signer" signing-key.pem
secret backup-tls "$dir/backup" ca.pem operator-backup.pem operator-backup-key.pem
cat <<YAML
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: mesh-trust
  namespace: mesh
  labels:
    app.kubernetes.io/part-of: mesh
data:
  ca.pem: |
$(sed 's/^/    /' "$dir/pki/ca.pem")
  roots.json: |
$(sed 's/^/    /' "$dir/roots.json")
  keyset.json: |
$(sed 's/^/    /' "$dir/keyset.json")
YAML
