#!/usr/bin/env bash
# The test command: installs what the tests need (llama-server and the Gemma model, into a cache
# outside the repo), then runs every test: the Rust suites, then the C hosts (plain, under
# valgrind, under ASan/UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-llama.sh >/dev/null
cargo test --all-targets
cargo test --doc
make -C examples/c test
