#!/bin/sh
# Builds virtual-pointer into OUTPUT_DIRECTORY: wayland-scanner makes the client glue from
# wlr-virtual-pointer-unstable-v1.xml, which Debian ships only in librust-wayland-protocols-dev.
#     build-virtual-pointer.sh OUTPUT_DIRECTORY
set -eu
out=$1
here=$(cd "$(dirname "$0")" && pwd)
xml=$(ls /usr/share/cargo/registry/wayland-protocols-*/wlr-protocols/unstable/wlr-virtual-pointer-unstable-v1.xml 2>/dev/null | tail -n 1)
if [ -z "$xml" ]; then
    echo "wlr-virtual-pointer-unstable-v1.xml is missing: run scripts/install-deps" >&2
    exit 1
fi
mkdir -p "$out"
wayland-scanner client-header "$xml" "$out/wlr-virtual-pointer-unstable-v1-client-protocol.h"
wayland-scanner private-code "$xml" "$out/wlr-virtual-pointer-unstable-v1-protocol.c"
gcc -std=c11 -Wall -Wextra -Werror -O2 -I"$out" -o "$out/virtual-pointer" \
    "$here/virtual-pointer.c" "$out/wlr-virtual-pointer-unstable-v1-protocol.c" $(pkg-config --cflags --libs wayland-client)
