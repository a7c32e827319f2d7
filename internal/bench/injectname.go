package bench

import "github.com/peregrine-net/peregrine/internal/workload/inject"

// injectProgName is the XDP program of the live-frame injector (internal/workload/inject).
const injectProgName = inject.ProgName
