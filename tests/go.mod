module mesh.dev/tests

go 1.26.0

require (
	mesh.dev/cmd/meshctl v0.0.0
	mesh.dev/internal v0.0.0
	mesh.dev/proto v0.0.0
	mesh.dev/services/catalog v0.0.0
	mesh.dev/services/composer v0.0.0
	mesh.dev/services/nodeengine v0.0.0
	mesh.dev/services/signer v0.0.0
)

replace (
	mesh.dev/cmd/meshctl => ../cmd/meshctl
	mesh.dev/internal => ../internal
	mesh.dev/proto => ../proto
	mesh.dev/services/catalog => ../services/catalog
	mesh.dev/services/composer => ../services/composer
	mesh.dev/services/nodeengine => ../services/nodeengine
	mesh.dev/services/signer => ../services/signer
)
