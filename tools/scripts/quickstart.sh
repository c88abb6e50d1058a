#!/usr/bin/env bash
# Everything from a fresh clone: dependencies, build, the default model, and
# a chat completion on it with tokens/s.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup_deps.sh
tools/scripts/build.sh
tools/scripts/get_model.sh
exec build/tools/hetkv run -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat -n 160 \
    -p "${1:-Explain in a few sentences why the sky is blue.}"
