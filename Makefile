# dragbroker: two commands matter, `make demo` and `make test`.
SWIFT ?= swift
BIN := .build/debug

.PHONY: all deps build release generated test demo bench interfaces install uninstall deb test-package test-package-chroot clean

all: release

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

# `make && sudo make install`: `make` builds what is installed, the release binaries with the
# Swift runtime linked in (so they run where Swift is not installed), in .build/static, apart
# from the debug build the tests use and the release build `make bench` uses. `make install`
# lays the files out as the Debian package does (`make deb`), under PREFIX (/usr/local).
# CONFIGURATION=debug installs the debug build instead (the tests do).
CONFIGURATION ?= release
ifeq ($(CONFIGURATION),release)
SCRATCH := .build/static
# Relocations resolved and made read-only at start (full RELRO), as Debian hardens its daemons.
BUILD_FLAGS := -c release --static-swift-stdlib --disable-local-rpath --scratch-path $(SCRATCH) \
	-Xlinker -z -Xlinker relro -Xlinker -z -Xlinker now
else
SCRATCH := .build
BUILD_FLAGS := -c $(CONFIGURATION)
endif
BUILT := $(SCRATCH)/$(CONFIGURATION)

release: deps
	$(SWIFT) build $(BUILD_FLAGS) --product dragbrokerd
	$(SWIFT) build $(BUILD_FLAGS) --product dragctl
	$(SWIFT) build $(BUILD_FLAGS) --product generate-manual

PREFIX ?= /usr/local
DESTDIR ?=
# The administrator's policy lives in /etc/dragbroker whatever the prefix: the daemon reads it there.
SYSCONFDIR ?= /etc
BINDIR := $(PREFIX)/bin
LIBEXECDIR := $(PREFIX)/libexec
USERUNITDIR := $(PREFIX)/lib/systemd/user
CATALOGDIR := $(PREFIX)/lib/systemd/catalog
DBUSSERVICEDIR := $(PREFIX)/share/dbus-1/services
# Empty to leave a completion out: the package installs bash's with dh_bash-completion.
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR := $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR := $(PREFIX)/share/fish/vendor_completions.d
DOCDIR := $(PREFIX)/share/doc/dragbroker
MANDIR := $(PREFIX)/share/man
MANUALS := $(wildcard man/*.[1-8])
INSTALLED := $(LIBEXECDIR)/dragbrokerd $(BINDIR)/dragctl $(USERUNITDIR)/dragbrokerd.service \
	$(DBUSSERVICEDIR)/org.dragbroker.Broker1.service $(ZSHCOMPDIR)/_dragctl \
	$(FISHCOMPDIR)/dragctl.fish $(MANDIR)/man1/dragctl.1 $(DOCDIR)/README.md $(DOCDIR)/examples/dragbroker.conf \
	$(CATALOGDIR)/dragbroker.catalog \
	$(foreach page,$(MANUALS),$(MANDIR)/man$(subst .,,$(suffix $(page)))/$(notdir $(page))) \
	$(if $(BASHCOMPDIR),$(BASHCOMPDIR)/dragctl)

# Completions and dragctl(1), generated from dragctl's own argument parser.
generated: $(BUILT)/dragctl $(BUILT)/generate-manual
	install -d $(BUILT)/generated
	# A completion is sourced, never run: bash's loses the generator's #! line.
	$(BUILT)/dragctl --generate-completion-script bash > $(BUILT)/generated/dragctl.bash.in
	sed '1{/^#!/d}' $(BUILT)/generated/dragctl.bash.in > $(BUILT)/generated/dragctl.bash
	$(BUILT)/dragctl --generate-completion-script zsh > $(BUILT)/generated/_dragctl
	$(BUILT)/dragctl --generate-completion-script fish > $(BUILT)/generated/dragctl.fish
	$(BUILT)/generate-manual $(BUILT)/dragctl --output-directory $(BUILT)/generated

$(BUILT)/dragctl $(BUILT)/dragbrokerd:
	@echo "No $(CONFIGURATION) build of $(notdir $@): run 'make' first" >&2; exit 1

# swift-argument-parser's manual generator, built once per configuration.
$(BUILT)/generate-manual:
	$(SWIFT) build $(BUILD_FLAGS) --product generate-manual

install: $(BUILT)/dragbrokerd generated
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(USERUNITDIR) $(DESTDIR)$(DBUSSERVICEDIR) \
		$(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(SYSCONFDIR)/dragbroker
	install -m 0755 $(BUILT)/dragbrokerd $(DESTDIR)$(LIBEXECDIR)/
	install -m 0755 $(BUILT)/dragctl $(DESTDIR)$(BINDIR)/
	sed 's|@libexecdir@|$(LIBEXECDIR)|g' systemd/dragbrokerd.service.in > $(DESTDIR)$(USERUNITDIR)/dragbrokerd.service
	sed 's|@libexecdir@|$(LIBEXECDIR)|g' systemd/org.dragbroker.Broker1.service.in > $(DESTDIR)$(DBUSSERVICEDIR)/org.dragbroker.Broker1.service
	$(if $(BASHCOMPDIR),install -D -m 0644 $(BUILT)/generated/dragctl.bash $(DESTDIR)$(BASHCOMPDIR)/dragctl)
	install -m 0644 $(BUILT)/generated/_dragctl $(DESTDIR)$(ZSHCOMPDIR)/_dragctl
	install -m 0644 $(BUILT)/generated/dragctl.fish $(DESTDIR)$(FISHCOMPDIR)/dragctl.fish
	install -m 0644 $(BUILT)/generated/dragctl.1 $(DESTDIR)$(MANDIR)/man1/dragctl.1
	$(foreach page,$(MANUALS),install -D -m 0644 $(page) $(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(page)))/$(notdir $(page));)
	install -D -m 0644 systemd/dragbroker.catalog $(DESTDIR)$(CATALOGDIR)/dragbroker.catalog
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	install -m 0644 examples/dragbroker.conf $(DESTDIR)$(DOCDIR)/examples/dragbroker.conf
	# An administrator's policy is never overwritten: only a missing one is installed.
	test -e $(DESTDIR)$(SYSCONFDIR)/dragbroker/dragbroker.conf || \
		install -m 0644 policy/dragbroker.conf $(DESTDIR)$(SYSCONFDIR)/dragbroker/dragbroker.conf

# Leaves /etc/dragbroker alone: the policy there is the administrator's.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))

# The Debian package of the release build, in this folder (dpkg-buildpackage writes it to ..).
deb: deps
	@scripts/install-deps package
	dpkg-buildpackage --build=binary --no-sign
	mv ../dragbroker_$(VERSION)_$(ARCH).deb ../dragbroker_$(VERSION)_$(ARCH).buildinfo ../dragbroker_$(VERSION)_$(ARCH).changes .
	-mv ../dragbroker-dbgsym_$(VERSION)_$(ARCH).deb . 2>/dev/null

VERSION = $(shell dpkg-parsechangelog -S Version)
ARCH = $(shell dpkg-architecture -qDEB_HOST_ARCH)

# Builds the package, then installs, upgrades, removes and purges it on this machine.
test-package: deb
	scripts/test-package dragbroker_$(VERSION)_$(ARCH).deb

# The same package on a clean Debian 12 chroot without Swift (needs mmdebstrap and the network).
test-package-chroot: deb
	scripts/test-package-chroot dragbroker_$(VERSION)_$(ARCH).deb

clean:
	rm -rf .build
