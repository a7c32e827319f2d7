package bench

// injectProgName is the XDP program of the live-frame injector (internal/workload/inject).
const injectProgName = "prg_inject_xdp"
