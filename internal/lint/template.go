package lint

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"text/template/parse"
)

// Limits of the work one template may do. Go's text/template runs loops
// over integers ({{ range 1000000000000 }}), recursion through named
// templates and variable reassignment ({{ $x = print $x $x }} doubles a
// string each time) with no bound of its own and no output to cap, so a
// module template accepted unchecked could hang the composer or exhaust its
// memory while rendering every node that places the module.
const (
	// MaxRangeDepth is the deepest nesting of range actions a template may
	// hold: the work of nested ranges is the product of their lengths.
	MaxRangeDepth = 2
	// MaxTemplateSteps bounds the range iterations (and template calls)
	// of one rendering.
	MaxTemplateSteps = 1 << 20
)

// checkTemplateWork refuses what lets a template do unbounded work: named
// templates (define, block, template: recursion), variable reassignment,
// range over anything but the data (.Params, .Facts or a variable holding
// part of them: a range over a number or a function's result is a loop of
// the template's choosing) and ranges nested deeper than MaxRangeDepth.
func checkTemplateWork(field string, t *template.Template) error {
	for _, tt := range t.Templates() {
		if tt.Name() != t.Name() {
			return errf(field, "{{ define %q }}: templates may not define or call other templates", tt.Name())
		}
	}
	if t.Tree == nil || t.Tree.Root == nil {
		return nil
	}
	w := &workWalker{field: field, dataVars: map[string]bool{"$": true}, computed: map[string]bool{}}
	w.declared(t.Tree.Root)
	return w.walk(t.Tree.Root, 0)
}

// workWalker walks a template's tree for checkTemplateWork.
type workWalker struct {
	field string
	// dataVars are variables every declaration of which binds part of the
	// data; computed are variables some declaration binds to anything else.
	dataVars, computed map[string]bool
}

// declared records every variable declaration (text/template scopes them,
// but a name declared once from the data and once from a literal is
// treated as computed everywhere: the check only has to be safe).
func (w *workWalker) declared(n parse.Node) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			w.declared(c)
		}
	case *parse.ActionNode:
		w.declared(n.Pipe)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		data := w.isData(n)
		for _, v := range n.Decl {
			name := v.Ident[0]
			if data && !w.computed[name] {
				w.dataVars[name] = true
			} else {
				w.computed[name] = true
				delete(w.dataVars, name)
			}
		}
	case *parse.RangeNode:
		// range $i, $e := <data>: both stand for parts of the data (the
		// index is bounded by its length).
		w.declared(n.Pipe)
		w.declared(n.List)
		w.declared(n.ElseList)
	case *parse.IfNode:
		w.declared(n.Pipe)
		w.declared(n.List)
		w.declared(n.ElseList)
	case *parse.WithNode:
		w.declared(n.Pipe)
		w.declared(n.List)
		w.declared(n.ElseList)
	}
}

// isData reports whether a pipeline is a plain reference to the data: dot,
// a field chain, or a variable holding part of the data, possibly in
// parentheses.
func (w *workWalker) isData(p *parse.PipeNode) bool {
	if p == nil || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	return w.isDataNode(p.Cmds[0].Args[0])
}

func (w *workWalker) isDataNode(n parse.Node) bool {
	switch n := n.(type) {
	case *parse.DotNode, *parse.FieldNode:
		return true
	case *parse.VariableNode:
		return w.dataVars[n.Ident[0]] && !w.computed[n.Ident[0]]
	case *parse.ChainNode:
		return w.isDataNode(n.Node)
	case *parse.PipeNode:
		return w.isData(n)
	}
	return false
}

func (w *workWalker) walk(n parse.Node, depth int) error {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := w.walk(c, depth); err != nil {
				return err
			}
		}
	case *parse.ActionNode:
		return w.walk(n.Pipe, depth)
	case *parse.PipeNode:
		if n == nil {
			return nil
		}
		if n.IsAssign {
			return errf(w.field, "{{ %s }}: template variables cannot be reassigned", n)
		}
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				if err := w.walk(a, depth); err != nil {
					return err
				}
			}
		}
	case *parse.TemplateNode:
		return errf(w.field, "{{ template %q }}: templates may not define or call other templates", n.Name)
	case *parse.RangeNode:
		if !w.isData(n.Pipe) {
			return errf(w.field, "{{ range %s }}: range only over .Params, .Facts or a variable holding part of them", pipeText(n.Pipe))
		}
		if depth+1 > MaxRangeDepth {
			return errf(w.field, "{{ range %s }} is nested %d deep, over the limit of %d", pipeText(n.Pipe), depth+1, MaxRangeDepth)
		}
		return w.branch(&n.BranchNode, depth+1)
	case *parse.IfNode:
		return w.branch(&n.BranchNode, depth)
	case *parse.WithNode:
		return w.branch(&n.BranchNode, depth)
	}
	return nil
}

func (w *workWalker) branch(b *parse.BranchNode, depth int) error {
	if err := w.walk(b.Pipe, depth); err != nil {
		return err
	}
	if err := w.walk(b.List, depth); err != nil {
		return err
	}
	// The else branch of a range runs only when the range did not.
	return w.walk(b.ElseList, depth)
}

// pipeText is a pipeline's source without its declarations.
func pipeText(p *parse.PipeNode) string {
	if p == nil {
		return ""
	}
	c := *p
	c.Decl = nil
	return c.String()
}

// ErrTemplateWork is wrapped when a rendering goes past MaxTemplateSteps
// or a string it builds grows past the output limit.
var ErrTemplateWork = errors.New("template does too much work")

// Literal reports whether a template source holds no action, so it renders
// as itself (text/template actions start with "{{").
func Literal(src string) bool { return !strings.Contains(src, "{{") }

// RenderTemplate renders a module template the one way mesh renders them
// (ParseTemplate) with a bound on its work, whatever the template: at most
// MaxTemplateSteps range iterations and template calls, and neither the
// output nor any string built by print, printf, println, html, js or
// urlquery longer than maxOut bytes. A template checkTemplateWork refuses
// is bounded too, so templates stored before that check, or reaching the
// renderer another way, cannot hang or exhaust it.
func RenderTemplate(name, src string, data any, maxOut int) (string, error) {
	steps := 0
	// workErr is the bound a rendering hit, reported without the
	// execution context text/template adds (it names the injected step).
	var workErr error
	tick := func() (string, error) {
		steps++
		if steps > MaxTemplateSteps {
			workErr = fmt.Errorf("%w: more than %d range iterations and template calls", ErrTemplateWork, MaxTemplateSteps)
			return "", workErr
		}
		return "", nil
	}
	capped := func(s string) (string, error) {
		if len(s) > maxOut {
			workErr = fmt.Errorf("%w: builds a string of more than %d bytes", ErrTemplateWork, maxOut)
			return "", workErr
		}
		return s, nil
	}
	funcs := template.FuncMap{
		tickFunc:   tick,
		"print":    func(args ...any) (string, error) { return capped(fmt.Sprint(args...)) },
		"printf":   func(f string, args ...any) (string, error) { return capped(fmt.Sprintf(f, args...)) },
		"println":  func(args ...any) (string, error) { return capped(fmt.Sprintln(args...)) },
		"html":     func(args ...any) (string, error) { return capped(template.HTMLEscaper(args...)) },
		"js":       func(args ...any) (string, error) { return capped(template.JSEscaper(args...)) },
		"urlquery": func(args ...any) (string, error) { return capped(template.URLQueryEscaper(args...)) },
	}
	t, err := template.New(name).Option("missingkey=error").Funcs(funcs).Parse(src)
	if err != nil {
		return "", err
	}
	tickTree, err := template.New("tick").Funcs(funcs).Parse("{{" + tickFunc + "}}")
	if err != nil {
		return "", err
	}
	tickNode := tickTree.Tree.Root.Nodes[0]
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		// Each call of a named template ticks, and so does each range
		// iteration: every loop text/template can run goes through one.
		tt.Tree.Root.Nodes = append([]parse.Node{tickNode}, tt.Tree.Root.Nodes...)
		injectTicks(tt.Tree.Root, tickNode)
	}
	buf := &cappedBuffer{limit: maxOut}
	if err := t.Execute(buf, data); err != nil {
		if workErr != nil {
			return "", workErr
		}
		return "", err
	}
	return buf.String(), nil
}

// tickFunc is the function RenderTemplate calls at each step; its name
// cannot collide with a builtin.
const tickFunc = "meshRenderStep"

func injectTicks(n parse.Node, tick parse.Node) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			injectTicks(c, tick)
		}
	case *parse.RangeNode:
		injectTicks(n.List, tick)
		injectTicks(n.ElseList, tick)
		if n.List != nil {
			n.List.Nodes = append([]parse.Node{tick}, n.List.Nodes...)
		}
	case *parse.IfNode:
		injectTicks(n.List, tick)
		injectTicks(n.ElseList, tick)
	case *parse.WithNode:
		injectTicks(n.List, tick)
		injectTicks(n.ElseList, tick)
	}
}

// cappedBuffer refuses to grow past a limit.
type cappedBuffer struct {
	bytes.Buffer
	limit int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.limit {
		return 0, fmt.Errorf("%w: renders more than %d bytes", ErrTemplateWork, b.limit)
	}
	return b.Buffer.Write(p)
}
