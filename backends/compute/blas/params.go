package blas

import (
	"fmt"
	"reflect"
	"sync/atomic"
	"unsafe"

	"github.com/gomlx/gomlx/backends/simplego"
)

// simplegoPkgPath is the import path of the package whose internals are read here.
const simplegoPkgPath = "github.com/gomlx/gomlx/backends/simplego"

// dotGeneralParams mirrors the leading fields of simplego's unexported dotGeneralNodeData, which
// Builder.DotGeneral stores (as a pointer) in the DotGeneral node's data field. Only this prefix is read;
// checkParamsType verifies names, types and offsets against the real struct before any read.
type dotGeneralParams struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
}

// nodeDataOffset is the offset of simplego.Node's unexported `data any` field, found by checkNodeLayout.
var nodeDataOffset uintptr

// checkNodeLayout finds simplego.Node's data field and checks it still holds an `any`, so that reading it
// through unsafe reads an interface value.
func checkNodeLayout() error {
	field, found := reflect.TypeFor[simplego.Node]().FieldByName("data")
	if !found {
		return fmt.Errorf("blas: simplego.Node has no field \"data\" (GoMLX internals changed; this package " +
			"was written against GoMLX v0.26.0)")
	}
	if field.Type != reflect.TypeFor[any]() {
		return fmt.Errorf("blas: simplego.Node.data has type %s, expected any (GoMLX internals changed; this "+
			"package was written against GoMLX v0.26.0)", field.Type)
	}
	nodeDataOffset = field.Offset
	return nil
}

// checkedParamsType holds the reflect.Type of the node data that checkParamsType accepted, so the check runs
// once and later calls only compare types.
var checkedParamsType atomic.Value

// paramsLayoutErr holds the first error checkParamsType found, so that Install's self-test can report why
// the executor fell back instead of routing.
var paramsLayoutErr atomic.Pointer[error]

// checkParamsType checks that dataType is *simplego.dotGeneralNodeData with the fields dotGeneralParams
// mirrors, at the same offsets and with the same types.
func checkParamsType(dataType reflect.Type) error {
	if dataType == nil || dataType.Kind() != reflect.Pointer || dataType.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("blas: DotGeneral node data is %v, expected a pointer to simplego's "+
			"dotGeneralNodeData (GoMLX internals changed; written against GoMLX v0.26.0)", dataType)
	}
	structType := dataType.Elem()
	if structType.PkgPath() != simplegoPkgPath || structType.Name() != "dotGeneralNodeData" {
		return fmt.Errorf("blas: DotGeneral node data is %s.%s, expected %s.dotGeneralNodeData (GoMLX internals "+
			"changed; written against GoMLX v0.26.0)", structType.PkgPath(), structType.Name(), simplegoPkgPath)
	}
	mirror := reflect.TypeFor[dotGeneralParams]()
	for i := range mirror.NumField() {
		want := mirror.Field(i)
		got, found := structType.FieldByName(want.Name)
		if !found || got.Type != want.Type || got.Offset != want.Offset {
			return fmt.Errorf("blas: simplego's dotGeneralNodeData.%s is not a %s at offset %d (GoMLX internals "+
				"changed; written against GoMLX v0.26.0)", want.Name, want.Type, want.Offset)
		}
	}
	return nil
}

// dotGeneralParamsOf returns the axes and sizes of a DotGeneral node, or nil if its data is not the struct
// checkParamsType accepts (then the caller falls back to simplego's own executor).
func dotGeneralParamsOf(node *simplego.Node) *dotGeneralParams {
	data := *(*any)(unsafe.Add(unsafe.Pointer(node), nodeDataOffset))
	dataType := reflect.TypeOf(data)
	if checked, _ := checkedParamsType.Load().(reflect.Type); checked != dataType {
		if err := checkParamsType(dataType); err != nil {
			paramsLayoutErr.CompareAndSwap(nil, &err)
			return nil
		}
		checkedParamsType.Store(dataType)
	}
	return (*dotGeneralParams)(reflect.ValueOf(data).UnsafePointer())
}
