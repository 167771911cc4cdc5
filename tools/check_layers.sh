#!/usr/bin/env bash
# Lower modules never import higher ones (ARCHITECTURE.md, "Layers and what each may
# import"): fails naming the first line that does.
set -euo pipefail
cd "$(dirname "$0")/../crates/qkv/src"

forbid() {
  local pattern="$1"
  shift
  if grep -rnE "use crate::($pattern)(::|;|\{)|crate::($pattern)::" "$@"; then
    echo "check_layers: the lines above import a higher layer ($pattern) from: $*" >&2
    exit 1
  fi
}

forbid "block|models|train|experiments" tensor.rs error.rs rng.rs batch.rs module.rs ops io layers attention position text rnn
forbid "models|train|experiments" block
forbid "train|experiments" models
forbid "experiments" train
echo "check_layers: ok"
