# peregrine build entry points. The eBPF objects (*_bpfel.o) and their Go bindings are committed,
# so `make build` needs only Go; `make generate` needs clang and libbpf headers, `make vmlinux` bpftool.
GO ?= go

.PHONY: build generate vmlinux

# A static binary: CGO off, so it runs on any node without matching libc.
build: libpd
	CGO_ENABLED=0 $(GO) build -o bin/peregrine ./cmd/peregrine

# libpd (PipeDevice's C API, libpd/pd.h): bin/libpd.so and bin/libpd.a, and its examples.
# PD_OUT=dir builds them elsewhere (the pipedevice tests build a private copy this way).
CC ?= cc
PD_CFLAGS = -O2 -g -Wall -Wextra -fPIC -pthread
PD_OUT ?= bin
.PHONY: libpd
libpd:
	@mkdir -p $(PD_OUT)
	$(CC) $(PD_CFLAGS) -c libpd/pd.c -o $(PD_OUT)/pd.o
	$(CC) $(PD_CFLAGS) -c libpd/pd_io.c -o $(PD_OUT)/pd_io.o
	$(CC) $(PD_CFLAGS) -c libpd/pd_epoll.c -o $(PD_OUT)/pd_epoll.o
	$(CC) -shared -pthread -Wl,-soname,libpd.so -o $(PD_OUT)/libpd.so $(PD_OUT)/pd.o $(PD_OUT)/pd_io.o $(PD_OUT)/pd_epoll.o
	ar rcs $(PD_OUT)/libpd.a $(PD_OUT)/pd.o $(PD_OUT)/pd_io.o $(PD_OUT)/pd_epoll.o
	$(CC) -O2 -Wall -Ilibpd -o $(PD_OUT)/pd-example-server libpd/examples/server.c $(PD_OUT)/libpd.a -pthread
	$(CC) -O2 -Wall -Ilibpd -o $(PD_OUT)/pd-example-client libpd/examples/client.c $(PD_OUT)/libpd.a -pthread

# Recompile bpf/*.bpf.c through the //go:generate (bpf2go) lines of the packages that load them.
generate:
	$(GO) generate ./...

# Refresh bpf/vmlinux.h from the running kernel (only when a program needs a type it lacks).
vmlinux:
	./scripts/gen-vmlinux.sh bpf/vmlinux.h

.PHONY: demo test
# The README's two commands, for those who prefer make.
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh

# Fuzzing (root: BPF_PROG_TEST_RUN): every eBPF packet program gets FUZZ_N generated frames
# (random, damaged, truncated at every offset, GSO metadata where a program reads it) checked
# against its Go model; the per-program frame counts and times are in the -v output. The test
# suite runs a slice of each (internal/testutil/frames.FuzzCount). FUZZ_PKGS: the packages that
# load eBPF packet programs (a package elsewhere that does not build must not stop the fuzzing).
FUZZ_N ?= 1000000
FUZZ_PKGS ?= ./internal/datapath/... ./internal/workload/inject/
.PHONY: fuzz
fuzz:
	PEREGRINE_FUZZ_N=$(FUZZ_N) $(GO) test -run Fuzz -count=1 -timeout 60m -v $(FUZZ_PKGS)
