// Package gomlxpatch holds what the packages patching GoMLX's gradients share: installing and restoring
// VJPs in graph.VJPRegistration, and reading an op's static parameters from GoMLX's unexported node
// inputs.
package gomlxpatch

import (
	"fmt"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// VJPPatch installs a set of VJPs into graph.VJPRegistration and restores the ones they replaced. The zero
// value of the unexported fields is ready to use; the exported fields must be set before Register and not
// changed afterwards.
type VJPPatch struct {
	// Name prefixes Register's panic message ("<Name>.Register: ...").
	Name string
	// Check, if not nil, runs before installing: a non-nil error makes Register panic with it.
	Check func() error
	// VJPs returns, per node type, the VJP to install given the one it replaces (nil if none was
	// registered), which it falls back on for the nodes it leaves alone.
	VJPs map[graph.NodeType]func(replaced graph.VJP) graph.VJP

	// mu serialises Register and Unregister, and guards the fields below.
	mu sync.Mutex
	// registered tells whether the VJPs are installed in graph.VJPRegistration.
	registered bool
	// replaced holds the VJPs that Register replaced (GoMLX's own, unless someone else patched them
	// first), for Unregister to restore.
	replaced map[graph.NodeType]graph.VJP
}

// Register installs the VJPs, remembering those they replace. It is idempotent and safe for concurrent
// callers, but must not run while graphs are being differentiated: graph.VJPRegistration is a plain map
// that graph.Gradient reads without a lock. It panics if Check fails.
func (p *VJPPatch) Register() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.registered {
		return
	}
	if p.Check != nil {
		if err := p.Check(); err != nil {
			panic(fmt.Sprintf("%s.Register: %v", p.Name, err))
		}
	}
	p.replaced = make(map[graph.NodeType]graph.VJP, len(p.VJPs))
	for nodeType, build := range p.VJPs {
		replaced := graph.VJPRegistration[nodeType]
		p.replaced[nodeType] = replaced
		graph.VJPRegistration[nodeType] = build(replaced)
	}
	p.registered = true
}

// Unregister restores the VJPs that Register replaced, removing the entries that had none. It is a no-op
// when not registered.
func (p *VJPPatch) Unregister() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.registered {
		return
	}
	for nodeType, replaced := range p.replaced {
		if replaced == nil {
			delete(graph.VJPRegistration, nodeType)
		} else {
			graph.VJPRegistration[nodeType] = replaced
		}
	}
	p.replaced = nil
	p.registered = false
}

// Registered reports whether the VJPs are installed.
func (p *VJPPatch) Registered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered
}

// With runs fn with the VJPs registered or not, and restores the previous state after: tests compare GoMLX's
// gradients with the patched ones in one process. Callers must not run concurrently with each other.
func (p *VJPPatch) With(register bool, fn func()) {
	if p.Registered() {
		defer p.Register()
	} else {
		defer p.Unregister()
	}
	if register {
		p.Register()
	} else {
		p.Unregister()
	}
	fn()
}

// Replaced returns the VJP that Register replaced for nodeType, nil when none was or when not registered.
func (p *VJPPatch) Replaced(nodeType graph.NodeType) graph.VJP {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replaced[nodeType]
}

// Gradients builds the gradients of a node's inputs, or returns false for a node it leaves to the VJP it
// replaced.
type Gradients func(node *graph.Node, outputVJPs []*graph.Node, outputShape shapes.Shape) ([]*graph.Node, bool)

// WithFallback returns the graph.VJP that uses build's gradients, and those of fallback for the nodes build
// leaves alone. With no fallback such nodes panic, the message prefixed by name.
func WithFallback(name string, build Gradients, fallback graph.VJP) graph.VJP {
	return func(node *graph.Node, outputVJPs []*graph.Node, outputShape shapes.Shape) []*graph.Node {
		if gradients, ok := build(node, outputVJPs, outputShape); ok {
			return gradients
		}
		if fallback == nil {
			panic(fmt.Sprintf("%s: no gradient for %s node %s, and no VJP was registered for it before",
				name, node.Type(), node))
		}
		return fallback(node, outputVJPs, outputShape)
	}
}
