# Builds the strict-mode interposer and its probe in the guest, incrementally.
#   make -f strict.mk O=BUILD_DIR [install]
# (not named Makefile: the repository ignores that name, as autotools output)
# The interposer does not link libibverbs: it is preloaded into every process and must
# not pull libibverbs into those that do not use it.
O ?= .
CFLAGS ?= -O2 -g
WARN = -Wall -Wextra -Wshadow
LIBDIR = /usr/local/lib/tbrdma
BINDIR = /usr/local/bin

all: $(O)/libtbrdma_strict.so $(O)/strict_probe

$(O)/libtbrdma_strict.so: tbrdma_strict.c
	@mkdir -p $(O)
	$(CC) $(CFLAGS) $(WARN) -fPIC -shared -fvisibility=hidden -pthread -Wl,-z,defs \
	    -o $@ $< -ldl

$(O)/strict_probe: strict_probe.c
	@mkdir -p $(O)
	$(CC) $(CFLAGS) $(WARN) -o $@ $< -libverbs

install: all
	install -D -m 0755 $(O)/libtbrdma_strict.so $(LIBDIR)/libtbrdma_strict.so
	install -D -m 0755 $(O)/strict_probe $(BINDIR)/tbrdma-strict-probe

.PHONY: all install
