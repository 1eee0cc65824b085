#!/usr/bin/env bash
# Installs libcorrex (shared and static), include/correx.h, a pkg-config file and the `correx`
# command under PREFIX (default /usr/local): `pkg-config --cflags --libs correx` then links
# against it, and `correx log show DB` reads a log.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${1:-/usr/local}"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)

cargo build --release --lib --bin correx
install -d "$PREFIX/lib/pkgconfig" "$PREFIX/include" "$PREFIX/bin"
install -m 0755 target/release/correx "$PREFIX/bin/"
install -m 0644 target/release/libcorrex.a "$PREFIX/lib/"
install -m 0755 target/release/libcorrex.so "$PREFIX/lib/"
install -m 0644 include/correx.h "$PREFIX/include/"
cat >"$PREFIX/lib/pkgconfig/correx.pc" <<PC
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: correx
Description: Infrastructure layer of a local-first LLM agent runtime (event log, llama-server, confined tools)
Version: $VERSION
Libs: -L\${libdir} -lcorrex
Libs.private: -lpthread -ldl -lm -lrt -lutil -lgcc_s
Cflags: -I\${includedir}
PC
echo "installed correx $VERSION under $PREFIX"
