package onebox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"mesh.dev/internal/identity"
	catalogv1 "mesh.dev/proto/mesh/catalog/v1"
	composerv1 "mesh.dev/proto/mesh/composer/v1"
	"mesh.dev/services/catalog/publish"
)

// PublishModules publishes every module directory under dir (each holding a
// module.yaml) as the builder ci: entry, artifacts, DONE build and
// registration; unchanged modules change nothing.
func (m *Mesh) PublishModules(ctx context.Context, dir string) ([]*publish.Result, error) {
	conn, err := m.Dial(m.Catalog, identity.RoleBuilder, "ci")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := catalogv1.NewCatalogServiceClient(conn)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("modules dir: %w", err)
	}
	var out []*publish.Result
	for _, e := range entries {
		md := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(md, "module.yaml")); err != nil {
			continue
		}
		res, err := publish.Dir(ctx, client, md, publish.Options{})
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

func mustStruct(v map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(v)
	if err != nil {
		panic(err)
	}
	return s
}

// DevSpec is the spec of the i-th dev node: every node runs sshd, motd,
// users, node-exporter and ca-bundle; the first also runs postgres and the
// backup that needs it.
func DevSpec(i int) *composerv1.NodeSpec {
	node := NodeName(i)
	ip := fmt.Sprintf("10.0.0.%d", 10+i)
	s := &composerv1.NodeSpec{
		Node:   node,
		Labels: map[string]string{"env": "dev", "role": "web"},
		Facts:  mustStruct(map[string]any{"ip": ip}),
		Modules: []*composerv1.PlacedModule{
			{Module: "sshd", Params: mustStruct(map[string]any{"port": 22})},
			{Module: "motd"},
			{Module: "users", Params: mustStruct(map[string]any{"users": []any{"alice", "bob"}})},
			{Module: "node-exporter", Params: mustStruct(map[string]any{"port": 9100, "collectors": []any{"cpu", "meminfo", "filesystem"}})},
			{Module: "ca-bundle"},
		},
	}
	if i == 1 {
		s.Labels["role"] = "db"
		s.Modules = append(s.Modules,
			&composerv1.PlacedModule{Module: "postgres", Params: mustStruct(map[string]any{
				"max_connections": 100, "shared_buffers": "128MB", "clients": []any{"10.0.0.0/24"}})},
			&composerv1.PlacedModule{Module: "backup", Params: mustStruct(map[string]any{
				"target": "s3://backups/" + node, "schedule": "daily"})},
		)
	}
	sort.Slice(s.Modules, func(a, b int) bool { return s.Modules[a].GetModule() < s.Modules[b].GetModule() })
	return s
}

// PutDevNodes puts DevSpec for every engine of the mesh as the operator
// admin (unchanged specs are put again; the composer sees no change).
func (m *Mesh) PutDevNodes(ctx context.Context) error {
	conn, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	client := composerv1.NewComposerServiceClient(conn)
	for i := range m.Engines {
		spec := DevSpec(i + 1)
		if got, err := client.GetNode(ctx, &composerv1.GetNodeRequest{Node: spec.GetNode()}); err == nil && got.GetSpec() != nil {
			continue
		}
		if _, err := client.PutNode(ctx, &composerv1.PutNodeRequest{Spec: spec}); err != nil {
			return fmt.Errorf("put node %s: %w", spec.GetNode(), err)
		}
	}
	return nil
}

// Status returns every node's status as the composer holds it.
func (m *Mesh) Status(ctx context.Context) ([]*composerv1.NodeStatus, error) {
	conn, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := composerv1.NewComposerServiceClient(conn).ListStatus(ctx, &composerv1.ListStatusRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetStatuses(), nil
}

// ApproveFirstPlacements approves every held move whose module the node
// does not run yet (a first placement of a MANUAL or PINNED module), once
// every dev node has an assignment. It returns what it approved, by module.
func (m *Mesh) ApproveFirstPlacements(ctx context.Context) (map[string][]string, error) {
	conn, err := m.Dial(m.Composer, identity.RoleOperator, "admin")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := composerv1.NewComposerServiceClient(conn)
	for {
		st, err := client.ListStatus(ctx, &composerv1.ListStatusRequest{})
		if err == nil && len(st.GetStatuses()) >= len(m.Engines) && allAssigned(st.GetStatuses()) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	holds, err := client.ListHolds(ctx, &composerv1.ListHoldsRequest{})
	if err != nil {
		return nil, err
	}
	digests := map[string][]string{}
	nodes := map[string][]string{}
	for _, n := range holds.GetNodes() {
		for _, h := range n.GetHolds() {
			if h.GetCompositionDigest() == "" || h.GetJudgement() != composerv1.Judgement_JUDGEMENT_NEW {
				continue
			}
			digests[h.GetModule()] = append(digests[h.GetModule()], h.GetCompositionDigest())
			nodes[h.GetModule()] = append(nodes[h.GetModule()], n.GetNode())
		}
	}
	for module, ds := range digests {
		if _, err := client.Approve(ctx, &composerv1.ApproveRequest{Module: module, Digests: ds, Note: "meshctl dev: first placement on the dev fleet"}); err != nil {
			return nil, fmt.Errorf("approve %s: %w", module, err)
		}
	}
	return nodes, nil
}

func allAssigned(sts []*composerv1.NodeStatus) bool {
	for _, st := range sts {
		if st.GetManifestRevision() == 0 && st.GetLastError() == "" {
			return false
		}
	}
	return true
}
