# peregrine build entry points. The eBPF objects (*_bpfel.o) and their Go bindings are committed,
# so `make build` needs only Go; `make generate` needs clang and libbpf headers, `make vmlinux` bpftool.
GO ?= go

.PHONY: build generate vmlinux

# A static binary: CGO off, so it runs on any node without matching libc.
build:
	CGO_ENABLED=0 $(GO) build -o bin/peregrine ./cmd/peregrine

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
