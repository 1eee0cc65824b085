#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --all-targets
cargo test --doc
