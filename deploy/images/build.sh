#!/usr/bin/env bash
# Builds mesh's container images: the four services, meshctl and the pinned
# nats-server, each a static binary (CGO_ENABLED=0, -trimpath) in an image
# FROM scratch (no registry is needed: nothing is pulled). No shell, no libc,
# no package manager: the binary, grpc-health-probe for the gRPC services'
# health checks, and the directories the process writes.
#
#   deploy/images/build.sh [--tag TAG] [--no-images] [IMAGE...]   build (default: every image)
#   deploy/images/build.sh --list [--tag TAG]                     print the image references
#
# IMAGE is one of: catalog signer composer nodeengine meshctl nats-server.
# Binaries land in bin/images/<image>/ (MESH_IMAGES_DIR overrides), so they
# can be copied onto machines for the systemd units as well; --no-images
# stops there (no docker needed).
#
# Rebuilding is cheap: go's build cache rebuilds only changed packages, the
# binaries are reproducible (-trimpath, no VCS stamp, fixed build id), and
# an image is rebuilt only when the sha256 of what goes into it differs from
# the label of the image already tagged.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=${MESH_IMAGE_TAG:-dev}
out=${MESH_IMAGES_DIR:-$top/bin/images}
go=${GO:-go}

# The pinned grpc-health-probe: docker and kubelet health checks of the gRPC
# services, which serve health only over mTLS (kubelet's own gRPC probe has no
# TLS). Go module proxy, checksum database verified.
health_probe=github.com/grpc-ecosystem/grpc-health-probe@v0.4.63

# Non-root user of every image but the node engine's (which writes files of
# any owner under its prefixes and so runs as root).
nonroot=65532

# image -> go package, built in the workspace (tools/ for nats-server).
declare -A pkg=(
	[catalog]=mesh.dev/services/catalog/cmd/mesh-catalog
	[signer]=mesh.dev/services/signer/cmd/mesh-signer
	[composer]=mesh.dev/services/composer/cmd/mesh-composer
	[nodeengine]=mesh.dev/services/nodeengine/cmd/mesh-nodeengine
	[meshctl]=mesh.dev/cmd/meshctl
	[nats-server]=github.com/nats-io/nats-server/v2
)
all=(catalog signer composer nodeengine meshctl nats-server)

# binary name, user, health probe and writable directories of each image.
bin_of() { case $1 in meshctl|nats-server) echo "$1" ;; *) echo "mesh-$1" ;; esac; }
user_of() { case $1 in nodeengine) echo 0:0 ;; *) echo "$nonroot:$nonroot" ;; esac; }
probe_of() { case $1 in catalog|signer|composer|nodeengine) echo yes ;; esac; }
# Directories owned by the image's user, so a fresh named volume mounted
# there is writable (docker copies ownership from the image into it).
dirs_of() {
	case $1 in
	signer) echo /var/lib/mesh-signer ;;
	nats-server) echo /data ;;
	nodeengine) echo /var/lib/mesh-nodeengine /node ;;
	esac
}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

list=false images=true want=()
while [ $# -gt 0 ]; do
	case $1 in
	--list) list=true ;;
	--tag) tag=$2; shift ;;
	--no-images) images=false ;;
	-h|--help) usage ;;
	-*) echo "build.sh: unknown flag $1" >&2; usage 2 >&2 ;;
	*) [ -n "${pkg[$1]:-}" ] || { echo "build.sh: unknown image $1 (want one of ${all[*]})" >&2; exit 2; }
	   want+=("$1") ;;
	esac
	shift
done
[ ${#want[@]} -gt 0 ] || want=("${all[@]}")

if $list; then
	for i in "${want[@]}"; do echo "mesh/$i:$tag"; done
	exit 0
fi

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
ldflags='-s -w -buildid='
build() { # build DIR PKG...
	local dir=$1; shift
	"$go" build -trimpath -ldflags="$ldflags" -o "$dir/" "$@"
}

stage=$out/.bin
mkdir -p "$stage"
# One go build for the workspace binaries shares the compile work.
ws=()
for i in "${want[@]}"; do
	case $i in nats-server) ;; *) ws+=("${pkg[$i]}") ;; esac
done
if [ ${#ws[@]} -gt 0 ]; then
	echo "building ${ws[*]##*/}"
	(cd "$top" && build "$stage" "${ws[@]}")
fi
if [[ " ${want[*]} " == *" nats-server "* ]]; then
	echo "building nats-server (tools/go.mod pin)"
	(cd "$top/tools" && GOWORK=off build "$stage" "${pkg[nats-server]}")
fi
need_probe=false
for i in "${want[@]}"; do [ -n "$(probe_of "$i")" ] && need_probe=true; done
if $need_probe; then
	echo "building grpc-health-probe ($health_probe)"
	(cd "$top" && GOWORK=off GOBIN="$stage" "$go" install -trimpath -ldflags="$ldflags" "$health_probe")
fi

for i in "${want[@]}"; do
	ctx=$out/$i
	b=$(bin_of "$i")
	rm -rf "$ctx" && mkdir -p "$ctx/rootfs" "$ctx/dirs"
	cp "$stage/$b" "$ctx/rootfs/$b"
	if [ -n "$(probe_of "$i")" ]; then
		cp "$stage/grpc-health-probe" "$ctx/rootfs/grpc-health-probe"
	fi
	for d in $(dirs_of "$i"); do mkdir -p "$ctx/dirs$d"; done
	user=$(user_of "$i")
	cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs/ /
COPY --chown=$user dirs/ /
USER $user
ENTRYPOINT ["/$b"]
DOCKERFILE
	$images || continue

	ref="mesh/$i:$tag"
	sum=$( (cd "$ctx" && find . -type f -o -type d | LC_ALL=C sort | while read -r f; do
		if [ -f "$f" ]; then sha256sum "$f"; else echo "dir $f"; fi
	done) | sha256sum | cut -d' ' -f1)
	have=$(docker image inspect --format '{{ index .Config.Labels "dev.mesh.content" }}' "$ref" 2>/dev/null || true)
	if [ "$have" = "$sum" ]; then
		echo "$ref is up to date"
		continue
	fi
	echo "docker build $ref"
	# The classic builder: it needs no buildx plugin, and FROM scratch
	# with COPY is all it has to do. Its deprecation notice is noise.
	if ! log=$(DOCKER_BUILDKIT=0 docker build -q --label "dev.mesh.content=$sum" -t "$ref" "$ctx" 2>&1); then
		echo "$log" >&2
		exit 1
	fi
done
