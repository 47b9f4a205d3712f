#!/usr/bin/env bash
# Installs libflashdiff into a prefix: lib/libflashdiff.{a,so}, include/flashdiff.h and
# lib/pkgconfig/flashdiff.pc. Run after `cargo build --release -p flashdiff-capi`:
#
#   capi/install.sh /usr/local            # or any prefix you can write
#   cc app.c $(PKG_CONFIG_PATH=/usr/local/lib/pkgconfig pkg-config --cflags --libs flashdiff)
#
# A second argument names the build directory (default: target/release).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${1:?usage: capi/install.sh PREFIX [BUILD_DIR]}"
build="${2:-$root/target/release}"
for f in libflashdiff.a libflashdiff.so; do
  [ -f "$build/$f" ] || { echo "error: $build/$f not found; run: cargo build --release -p flashdiff-capi" >&2; exit 1; }
done
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
[ -n "$version" ] || { echo "error: no version in $root/Cargo.toml" >&2; exit 1; }
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0644 "$build/libflashdiff.a" "$prefix/lib/"
install -m 0755 "$build/libflashdiff.so" "$prefix/lib/"
install -m 0644 "$root/include/flashdiff.h" "$prefix/include/"
cat > "$prefix/lib/pkgconfig/flashdiff.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: flashdiff
Description: FlashDiff diffusion serving policies and engine (C ABI)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lflashdiff
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
PC
echo "installed libflashdiff $version into $prefix"
