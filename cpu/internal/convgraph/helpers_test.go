package convgraph

import (
	"testing"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

func TestMain(m *testing.M) { computetest.Main(m) }
