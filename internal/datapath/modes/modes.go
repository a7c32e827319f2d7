// Package modes links every datapath mode into a program: each mode registers itself with the
// datapath registry in its init. Import it for its side effect wherever modes are looked up by
// name (the CLI, the benchmarks).
package modes

import (
	_ "github.com/peregrine-net/peregrine/internal/datapath/ezpath"   // ezpath
	_ "github.com/peregrine-net/peregrine/internal/datapath/falcon"   // falcon
	_ "github.com/peregrine-net/peregrine/internal/datapath/fastpath" // fastpath
	_ "github.com/peregrine-net/peregrine/internal/datapath/mflow"    // mflow
	_ "github.com/peregrine-net/peregrine/internal/datapath/prism"    // prism
	_ "github.com/peregrine-net/peregrine/internal/datapath/rps"      // rps
)
