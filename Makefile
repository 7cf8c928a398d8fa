# dragbroker: two commands matter, `make demo` and `make test`.
SWIFT ?= swift
BIN := .build/debug

.PHONY: all deps build test demo clean

all: build

deps:
	@scripts/install-deps

build: deps
	$(SWIFT) build

test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build

demo: build
	@scripts/demo

clean:
	rm -rf .build
