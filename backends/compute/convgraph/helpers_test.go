package convgraph

import (
	"testing"

	"github.com/goaccel/goaccel/backends/compute/internal/computetest"
)

func TestMain(m *testing.M) { computetest.Main(m) }
