module mesh.dev/cmd/meshctl

go 1.26.0

require (
	mesh.dev/internal v0.0.0
	mesh.dev/proto v0.0.0
	mesh.dev/services/catalog v0.0.0
	mesh.dev/services/composer v0.0.0
	mesh.dev/services/nodeengine v0.0.0
	mesh.dev/services/signer v0.0.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)

replace (
	mesh.dev/internal => ../../internal
	mesh.dev/proto => ../../proto
	mesh.dev/services/catalog => ../../services/catalog
	mesh.dev/services/composer => ../../services/composer
	mesh.dev/services/nodeengine => ../../services/nodeengine
	mesh.dev/services/signer => ../../services/signer
)
