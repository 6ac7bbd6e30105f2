module mesh.dev/services/composer

go 1.26.0

require (
	mesh.dev/internal v0.0.0
	mesh.dev/proto v0.0.0
)

replace (
	mesh.dev/internal => ../../internal
	mesh.dev/proto => ../../proto
)
