//go:build !amd64 || purego

package gemmtile

// Without assembly (other architectures, and builds with the purego tag) Tile runs tileGo.
var accelerated, wide = false, false

func tile6x16(*float32, int, *[Rows]*float32, *int32, int, *float32, int, int) {
	panic("gemmtile: no assembly on this architecture")
}

func tile6x8(*float32, int, *[Rows]*float32, *int32, int, *float32, int, int) {
	panic("gemmtile: no assembly on this architecture")
}

func tile6x64(*float32, int, *[Rows]*float32, *int32, int, *float32, int, int) {
	panic("gemmtile: no assembly on this architecture")
}

func tile6x32(*float32, int, *[Rows]*float32, *int32, int, *float32, int, int) {
	panic("gemmtile: no assembly on this architecture")
}

func tile6x16wide(*float32, int, *[Rows]*float32, *int32, int, *float32, int, int) {
	panic("gemmtile: no assembly on this architecture")
}
