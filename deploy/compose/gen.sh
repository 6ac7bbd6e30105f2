#!/usr/bin/env bash
# Generates everything a mesh deployment needs that is secret or specific to
# it, into one directory: the dev CA and one certificate per container, the
# offline root key, the trust roots, the signer's online key and the keyset
# the root signs for it, and each service's configuration file. The compose
# deployment (docker-compose.yml beside this script) mounts it; the
# Kubernetes Secrets are made from it (deploy/k8s/secrets.sh).
#
#   deploy/compose/gen.sh [--nodes "ace bay cod"] [--bin DIR] [--trust-domain TD] DIR
#
# --bin is where meshctl and mesh-signer are (default bin/images/.bin, what
# deploy/images/build.sh builds). openssl issues the NATS servers'
# certificates (mesh identities are SPIFFE IDs of services, nodes, operators
# and builders; a NATS server is none of them, so meshctl does not issue
# for it).
#
# DIR must not exist yet. Layout:
#   pki/                 ca.pem, ca-key.pem (the CA key: keep it offline),
#                        operator-admin and builder-ci certificates
#   root/                root-key.pem (offline in production), root.pub.json
#   roots.json           the trust roots engines, signer and composers pin
#   keyset.json          the keyset signed by the root
#   nats-N/              certs/{ca,server,server-key}.pem, data/ (N = 0, 1, 2)
#   nats-all/certs/      the Kubernetes StatefulSet's certificate
#   catalog/, signer/, composer-1/, composer-2/, node-<name>/
#                        each container's certificate, key, ca.pem, roots
#                        and configuration file, mounted at /etc/mesh
#   backup/, restore/    ca.pem and the operator-backup / operator-restore
#                        certificate and key (NATS users of deploy/nats)
#   backups/             where the compose backup service writes archives
#   signer/state/        the signer's state dir (revisions, audit log)
#   compose.env          variables docker-compose.yml reads (--env-file)
#   otel.env             OTEL_* variables every service reads
#
# Run as root, every container's files are chowned to the user its image
# runs as (65532, or 0 for node engines); run as another user, the services
# run as that user instead (compose.env's MESH_UID), so they can read their
# keys either way without any key being readable by others.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
nodes="ace bay cod"
bin=$top/bin/images/.bin
td=mesh.local
while [ $# -gt 1 ]; do
	case $1 in
	--nodes) nodes=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	--trust-domain) td=$2; shift 2 ;;
	*) echo "gen.sh: unknown flag $1" >&2; exit 2 ;;
	esac
done
[ $# -eq 1 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$1
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
	echo "gen.sh: $dir exists and is not empty; refusing to replace keys" >&2
	exit 1
fi
for b in meshctl mesh-signer; do
	[ -x "$bin/$b" ] || { echo "gen.sh: $bin/$b missing (run deploy/images/build.sh, or pass --bin)" >&2; exit 1; }
done
command -v openssl >/dev/null || { echo "gen.sh: openssl is required for the NATS server certificates" >&2; exit 1; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
meshctl() { "$bin/meshctl" "$@"; }
umask 077

# --- certificates --------------------------------------------------------
pki=$dir/pki
meshctl certs init --dir "$pki" --trust-domain "$td" >/dev/null
# A directory per container, holding only what that container reads.
place() { # place CONTAINER BASENAME: move <basename>{,-key}.pem into it
	mkdir -p "$dir/$1"
	mv "$pki/$2.pem" "$dir/$1/$2.pem"
	mv "$pki/$2-key.pem" "$dir/$1/$2-key.pem"
	cp "$pki/ca.pem" "$dir/$1/ca.pem"
}
# Services are reached by their role name (localhost, <role>: meshctl's
# default SANs) in compose and, in Kubernetes, as <role>.mesh.svc too.
for s in catalog signer; do
	rm "$pki/$s.pem" "$pki/$s-key.pem"
	meshctl certs issue --dir "$pki" --role "$s" --dns "$s.mesh.svc,$s.mesh.svc.cluster.local" >/dev/null
	place "$s" "$s"
done
# Each composer replica has a certificate of its own (same identity,
# service/composer; its own key), naming its container too. Kubernetes runs
# the composers as one Deployment, which mounts composer-1's.
rm "$pki/composer.pem" "$pki/composer-key.pem"
for c in composer-1 composer-2; do
	meshctl certs issue --dir "$pki" --role composer --dns "$c,composer.mesh.svc,composer.mesh.svc.cluster.local" >/dev/null
	place "$c" composer
done
for n in $nodes; do
	meshctl certs issue --dir "$pki" --role node --name "$n" --dns "node-$n" >/dev/null
	place "node-$n" "node-$n"
done
# The operators who back up and restore JetStream (meshctl backup, meshctl
# restore): NATS users operator/backup (read-only) and operator/restore of
# deploy/nats. Each directory is what that job mounts (compose services
# backup and restore, the Kubernetes CronJob's Secret backup-tls); keep
# restore/ offline with pki/ until a restore.
for op in backup restore; do
	meshctl certs issue --dir "$pki" --role operator --name "$op" >/dev/null
	place "$op" "operator-$op"
done
mkdir -p "$dir/backups"

# NATS servers: one certificate each for compose and machines, naming the
# server as nats-N.nats (the network alias, and the Kubernetes pod behind the
# headless Service nats in namespace mesh) and loopback for a client on the
# same machine; and one for the Kubernetes StatefulSet, whose pods share a
# Secret, naming all three.
for i in 0 1 2 all; do
	d=$dir/nats-$i/certs
	mkdir -p "$d"
	[ "$i" = all ] || mkdir -p "$dir/nats-$i/data"
	cp "$pki/ca.pem" "$d/ca.pem"
	sans=
	for j in 0 1 2; do
		[ "$i" = all ] || [ "$i" = "$j" ] || continue
		sans+="DNS:nats-$j.nats,DNS:nats-$j,DNS:nats-$j.nats.mesh.svc,DNS:nats-$j.nats.mesh.svc.cluster.local,"
	done
	sans+="DNS:nats,DNS:nats.mesh.svc,DNS:localhost,IP:127.0.0.1"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$d/server-key.pem" -subj "/O=mesh/CN=nats-$i" -out "$d/server.csr" 2>/dev/null
	openssl x509 -req -in "$d/server.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca-key.pem" \
		-set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 -out "$d/server.pem" \
		-extfile <(printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
			"extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$sans") 2>/dev/null
	rm "$d/server.csr"
	chmod 644 "$d/server.pem" "$d/ca.pem"
done

# --- keys: root (offline), trust roots, the signer's online key, keyset --
meshctl keys root-init --dir "$dir/root" --name root >/dev/null
meshctl keys roots --threshold 1 --out "$dir/roots.json" "$dir/root/root.pub.json" >/dev/null
"$bin/mesh-signer" init --signing-key-file "$dir/signer/signing-key.pem" >/dev/null
meshctl keys sign-keyset --version 1 --key "$dir/signer/signing-key.pem.pub.json" \
	--root-key "$dir/root/root-key.pem" --roots "$dir/roots.json" --out "$dir/keyset.json" >/dev/null
chmod 644 "$dir/roots.json" "$dir/keyset.json"
cp "$dir/keyset.json" "$dir/signer/keyset.json"
for c in signer composer-1 composer-2 $(for n in $nodes; do echo "node-$n"; done); do
	cp "$dir/roots.json" "$dir/$c/roots.json"
done
mkdir -p "$dir/signer/state"

# --- configuration files (strict YAML: unknown keys are refused) ----------
nats_url=tls://nats-0.nats:4222,tls://nats-1.nats:4222,tls://nats-2.nats:4222
cat >"$dir/catalog/catalog.yaml" <<EOF
listen: 0.0.0.0:7401
metrics_listen: 0.0.0.0:9401
cert_file: /etc/mesh/catalog.pem
key_file: /etc/mesh/catalog-key.pem
ca_file: /etc/mesh/ca.pem
nats:
  url: $nats_url
  ca_file: /etc/mesh/ca.pem
  cert_file: /etc/mesh/catalog.pem
  key_file: /etc/mesh/catalog-key.pem
  replicas: 3
EOF
cat >"$dir/signer/signer.yaml" <<EOF
listen: 0.0.0.0:7402
metrics_listen: 0.0.0.0:9402
cert_file: /etc/mesh/signer.pem
key_file: /etc/mesh/signer-key.pem
ca_file: /etc/mesh/ca.pem
signing_key_file: /etc/mesh/signing-key.pem
keyset_file: /etc/mesh/keyset.json
roots_file: /etc/mesh/roots.json
state_dir: /var/lib/mesh-signer
own_prefixes: [/etc/mesh-node]
catalog_addr: catalog:7401
EOF
for c in composer-1 composer-2; do
	cat >"$dir/$c/composer.yaml" <<EOF
listen: 0.0.0.0:7403
metrics_listen: 0.0.0.0:9403
cert_file: /etc/mesh/composer.pem
key_file: /etc/mesh/composer-key.pem
ca_file: /etc/mesh/ca.pem
roots_file: /etc/mesh/roots.json
signer_addr: signer:7402
catalog_addr: catalog:7401
holder: $c
nats:
  url: $nats_url
  ca_file: /etc/mesh/ca.pem
  cert_file: /etc/mesh/composer.pem
  key_file: /etc/mesh/composer-key.pem
  replicas: 3
EOF
done
for n in $nodes; do
	# The engine applies under /node (a volume standing in for the
	# machine's /) and resolves owners in this node's passwd and group.
	cat >"$dir/node-$n/nodeengine.yaml" <<EOF
root: /node
state_dir: /var/lib/mesh-nodeengine
roots_file: /etc/mesh/roots.json
allow_prefixes: [/etc, /usr/local/bin, /var/lib, /opt]
composer_addr: composer:7403
catalog_addr: catalog:7401
admin_listen: 0.0.0.0:7404
metrics_listen: 0.0.0.0:9404
cert_file: /etc/mesh/node-$n.pem
key_file: /etc/mesh/node-$n-key.pem
ca_file: /etc/mesh/ca.pem
EOF
	printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'postgres:x:70:70:postgres:/var/lib/postgresql:/sbin/nologin' \
		'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >"$dir/node-$n/passwd"
	printf '%s\n' 'root:x:0:' 'postgres:x:70:' 'nogroup:x:65534:' >"$dir/node-$n/group"
	chmod 644 "$dir/node-$n/passwd" "$dir/node-$n/group"
done

# The NATS servers' configuration, its users named in this trust domain.
sed "s|spiffe://mesh.local/|spiffe://$td/|g" "$top/deploy/nats/nats-server.conf" >"$dir/nats-server.conf"
chmod 644 "$dir/nats-server.conf"

# --- ownership ------------------------------------------------------------
if [ "$(id -u)" = 0 ]; then
	uid=65532 gid=65532
	for c in catalog signer composer-1 composer-2 nats-0 nats-1 nats-2 backup restore backups; do
		chown -R "$uid:$gid" "$dir/$c"
	done
else
	uid=$(id -u) gid=$(id -g)
fi
chmod 755 "$dir"
for c in catalog signer composer-1 composer-2 nats-0 nats-1 nats-2 nats-all backup restore backups $(for n in $nodes; do echo "node-$n"; done); do
	chmod 700 "$dir/$c"
done

cat >"$dir/compose.env" <<EOF
# Read by docker-compose (--env-file); written by deploy/compose/gen.sh.
MESH_DIR=$dir
MESH_UID=$uid
MESH_GID=$gid
MESH_BACKUP_DIR=$dir/backups
EOF
cat >"$dir/otel.env" <<'EOF'
# OTEL_* variables every mesh service reads (internal/telemetry). Set
# OTEL_EXPORTER_OTLP_ENDPOINT to export traces and metrics, e.g.
#   OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4317
OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=compose
EOF
chmod 644 "$dir/compose.env" "$dir/otel.env"
echo "wrote the deployment of nodes ($nodes) to $dir"
