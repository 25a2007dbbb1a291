package replicas

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Describe renders v's configuration — its type and every field, unexported ones included, followed
// through pointers — as text that is the same on every rank for equal configurations: unlike %+v it never
// prints addresses, and it sorts map keys. Functions and channels are shown by type only. Ranks compare
// Describe's text to find settings that differ (an optimizer's hyperparameters live in unexported fields).
func Describe(v any) string {
	var b strings.Builder
	describe(&b, reflect.ValueOf(v), map[uintptr]bool{}, 0)
	return b.String()
}

// maxDescribeDepth stops runaway recursion in deeply nested or self-referencing values.
const maxDescribeDepth = 8

func describe(b *strings.Builder, v reflect.Value, seen map[uintptr]bool, depth int) {
	if !v.IsValid() {
		b.WriteString("nil")
		return
	}
	if depth > maxDescribeDepth {
		b.WriteString("…")
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			fmt.Fprintf(b, "(%s)nil", v.Type())
			return
		}
		if seen[v.Pointer()] {
			b.WriteString("<cycle>")
			return
		}
		seen[v.Pointer()] = true
		defer delete(seen, v.Pointer())
		b.WriteString("&")
		describe(b, v.Elem(), seen, depth+1)
	case reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		describe(b, v.Elem(), seen, depth+1)
	case reflect.Struct:
		fmt.Fprintf(b, "%s{", v.Type())
		for i := range v.NumField() {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(v.Type().Field(i).Name + ":")
			describe(b, v.Field(i), seen, depth+1)
		}
		b.WriteString("}")
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			b.WriteString("[]")
			return
		}
		b.WriteString("[")
		for i := range v.Len() {
			if i > 0 {
				b.WriteString(" ")
			}
			describe(b, v.Index(i), seen, depth+1)
		}
		b.WriteString("]")
	case reflect.Map:
		keys := v.MapKeys()
		texts := make([]string, len(keys))
		for i, k := range keys {
			var kb strings.Builder
			describe(&kb, k, seen, depth+1)
			kb.WriteString(":")
			describe(&kb, v.MapIndex(k), seen, depth+1)
			texts[i] = kb.String()
		}
		sort.Strings(texts)
		b.WriteString("map[" + strings.Join(texts, " ") + "]")
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Uintptr:
		fmt.Fprintf(b, "(%s)", v.Type())
	case reflect.Bool:
		fmt.Fprint(b, v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		fmt.Fprint(b, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		fmt.Fprint(b, v.Uint())
	case reflect.Float32, reflect.Float64:
		fmt.Fprint(b, v.Float())
	case reflect.Complex64, reflect.Complex128:
		fmt.Fprint(b, v.Complex())
	case reflect.String:
		fmt.Fprintf(b, "%q", v.String())
	default:
		fmt.Fprintf(b, "(%s)", v.Type())
	}
}
