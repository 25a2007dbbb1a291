// Package layering holds the test that keeps goaccel's packages in layers: each package imports only
// packages of lower layers (docs/architecture.md draws them). It has no code of its own.
package layering
