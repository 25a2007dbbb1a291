package gomlxpatch

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLinknameTargetsMatchGoMLXSource reads simplego's source, as the go command resolves it for this
// module, and checks that every symbol pulled in with go:linkname still has the declaration this package
// mirrors. A linkname binds by name only: if GoMLX changed an executor's parameters or the tables' element
// types, the program would still link and then corrupt memory, so this test is what fails instead.
func TestLinknameTargetsMatchGoMLXSource(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/gomlx/gomlx/backends/simplego").Output()
	require.NoError(t, err, "locating simplego's source")
	dir := strings.TrimSpace(string(out))
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	pkg := pkgs["simplego"]
	require.NotNil(t, pkg, "package simplego in %s", dir)

	render := func(node any) string {
		var b bytes.Buffer
		require.NoError(t, printer.Fprint(&b, fset, node))
		return b.String()
	}
	found := map[string]string{}
	for _, file := range pkg.Files {
		for _, decl := range file.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && d.Name.Name == "newNode" {
					found["(*Builder).newNode"] = render(d.Recv.List[0].Type) + " " + render(d.Type)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						found["type "+s.Name.Name] = render(s.Type)
					case *ast.ValueSpec:
						for i, name := range s.Names {
							if s.Type != nil {
								found["var "+name.Name] = render(s.Type)
							}
							if i < len(s.Values) {
								found["value "+name.Name] = render(s.Values[i])
							}
						}
					}
				}
			}
		}
	}
	// The declarations Executor, simplegoExecutors, simplegoExecutorPriorities, simplegoNewNode and
	// PriorityUser mirror, as written in GoMLX v0.26.0.
	for symbol, want := range map[string]string{
		"type nodeExecutor":         "func(backend *Backend, node *Node, inputs []*Buffer, inputsOwned []bool) (*Buffer, error)",
		"var nodeExecutors":         "[backends.OpTypeLast]nodeExecutor",
		"var nodeExecutorsPriority": "[backends.OpTypeLast]registerPriority",
		"type registerPriority":     "int",
		"value priorityUser":        "100",
		"(*Builder).newNode":        "*Builder func(opType backends.OpType, shape shapes.Shape, inputs ...*Node) *Node",
		"type Node":                 "", // checked field by field by CheckSimplegoLayout
	} {
		got, ok := found[symbol]
		if !assert.True(t, ok, "simplego no longer declares %s: goaccel's go:linkname targets changed", symbol) || want == "" {
			continue
		}
		assert.Equal(t, want, got, "simplego's %s changed: update gomlxpatch's mirror before using this GoMLX", symbol)
	}
	assert.NoError(t, CheckSimplegoLayout())
}
