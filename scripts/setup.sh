#!/usr/bin/env bash
# Install autorl and what it needs on a fresh machine.
#   bash scripts/setup.sh          # autorl + the embedded engine (CPU torch unless a torch is present)
#   bash scripts/setup.sh --test   # also everything the test suite uses (TRL, Ray, TensorBoard, GNU patch)
# For a CUDA machine, install the CUDA build of torch first; this script keeps an existing torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

# System packages: git always; for the tests also GNU patch (OpenRLHF patches) and Chromium (report test).
need=""
command -v git >/dev/null || need="git"
if [ $want_test = 1 ]; then
  command -v patch >/dev/null || need="$need patch"
  command -v chromium >/dev/null || need="$need chromium"
fi
if [ -n "$need" ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi

if ! $PY -c "import torch" 2>/dev/null; then
  # The CPU build: a bare `torch` requirement would pull the multi-GB CUDA build.
  $PY -m pip install -q "torch==2.13.0"
fi

if [ $want_test = 1 ]; then
  $PY -m pip install -q -e ".[engine,dev,trl,ray,report]"
else
  $PY -m pip install -q -e ".[engine]"
fi
echo "autorl installed: $($PY -m autorl.cli --version 2>/dev/null || echo '?')"
