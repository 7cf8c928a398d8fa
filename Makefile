# dragbroker: two commands matter, `make demo` and `make test`.
SWIFT ?= swift
BIN := .build/debug

.PHONY: all deps build test demo bench interfaces install uninstall clean

all: build

deps:
	@scripts/install-deps

build: deps
	$(SWIFT) build

test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) build --product generate-manual
	$(SWIFT) test --skip-build

demo: build
	@scripts/demo

# The published interface XML, written from the tables in Sources/BrokerProtocol/Interfaces.swift
# after a member changes there; `make test` fails while the files and the tables differ.
interfaces:
	$(SWIFT) run generate-interfaces Sources/BrokerProtocol/Interfaces

# Throughput and latency through the daemon against a plain pipe and a bus echo, BrokerClient
# against a plain C client (dragbroker-bench-c), and concurrent loads (release build).
bench: deps
	$(SWIFT) build -c release --product dragbrokerd
	$(SWIFT) build -c release --product dragbroker-bench
	$(SWIFT) build -c release --product dragbroker-bench-c
	.build/release/dragbroker-bench

# `make && sudo make install`: binaries, the user unit, D-Bus activation, completions,
# the example policy. CONFIGURATION=debug installs the debug build instead.
PREFIX ?= /usr/local
DESTDIR ?=
CONFIGURATION ?= release
BINDIR := $(PREFIX)/bin
USERUNITDIR := $(PREFIX)/lib/systemd/user
DBUSSERVICEDIR := $(PREFIX)/share/dbus-1/services
BASHCOMPDIR := $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR := $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR := $(PREFIX)/share/fish/vendor_completions.d
DOCDIR := $(PREFIX)/share/doc/dragbroker
MAN1DIR := $(PREFIX)/share/man/man1
BUILT := .build/$(CONFIGURATION)
INSTALLED := $(BINDIR)/dragbrokerd $(BINDIR)/dragctl $(USERUNITDIR)/dragbrokerd.service \
	$(DBUSSERVICEDIR)/org.dragbroker.Broker1.service $(BASHCOMPDIR)/dragctl $(ZSHCOMPDIR)/_dragctl \
	$(FISHCOMPDIR)/dragctl.fish $(MAN1DIR)/dragctl.1 $(DOCDIR)/README.md $(DOCDIR)/examples/dragbroker.conf

# swift-argument-parser's manual generator, built once per configuration.
$(BUILT)/generate-manual:
	$(SWIFT) build -c $(CONFIGURATION) --product generate-manual

install: $(BUILT)/generate-manual
	@test -x $(BUILT)/dragbrokerd -a -x $(BUILT)/dragctl || \
		{ echo "No $(CONFIGURATION) build: run 'swift build -c $(CONFIGURATION)' first" >&2; exit 1; }
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(USERUNITDIR) $(DESTDIR)$(DBUSSERVICEDIR) \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(MAN1DIR)
	install -m 0755 $(BUILT)/dragbrokerd $(BUILT)/dragctl $(DESTDIR)$(BINDIR)/
	sed 's|@bindir@|$(BINDIR)|g; s|@docdir@|$(DOCDIR)|g' systemd/dragbrokerd.service.in > $(DESTDIR)$(USERUNITDIR)/dragbrokerd.service
	sed 's|@bindir@|$(BINDIR)|g' systemd/org.dragbroker.Broker1.service.in > $(DESTDIR)$(DBUSSERVICEDIR)/org.dragbroker.Broker1.service
	$(BUILT)/dragctl --generate-completion-script bash > $(DESTDIR)$(BASHCOMPDIR)/dragctl
	$(BUILT)/dragctl --generate-completion-script zsh > $(DESTDIR)$(ZSHCOMPDIR)/_dragctl
	$(BUILT)/dragctl --generate-completion-script fish > $(DESTDIR)$(FISHCOMPDIR)/dragctl.fish
	$(BUILT)/generate-manual $(BUILT)/dragctl --output-directory $(DESTDIR)$(MAN1DIR)
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	install -m 0644 examples/dragbroker.conf $(DESTDIR)$(DOCDIR)/examples/dragbroker.conf

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))

clean:
	rm -rf .build
