#!/usr/bin/env bash
# Install autorl and what it needs on a fresh machine, into the project venv `.venv/`.
#   bash scripts/setup.sh          # autorl + the embedded engine (CPU torch unless the venv has a torch)
#   bash scripts/setup.sh --test   # also everything the test suite uses (TRL, Ray, TensorBoard, GNU patch)
# The venv sees no system site-packages, so what autorl imports is exactly what pyproject.toml declares.
# Enter it with `. .venv/bin/activate` (or call `.venv/bin/autorl`). AUTORL_VENV picks another folder.
# For a CUDA machine: create the venv, install the CUDA build of torch into it first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AUTORL_VENV:-.venv}

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

[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
VPY="$VENV/bin/python"
$VPY -m pip install -q --upgrade pip >/dev/null

if ! $VPY -c "import torch" 2>/dev/null; then
  # The CPU build: on PyPI a bare `torch` (or `torch==2.13.0`) for Linux is the multi-GB CUDA build, so PyTorch's
  # CPU index is asked first (its `2.13.0+cpu` sorts above PyPI's `2.13.0`). Where that index cannot be reached
  # (a machine that sees only a mirror), pip's own index decides, and the line below says which build came.
  CPU_INDEX=https://download.pytorch.org/whl/cpu
  if $VPY -c "import urllib.request as u; u.urlopen('$CPU_INDEX/torch/', timeout=5)" 2>/dev/null; then
    $VPY -m pip install -q "torch==2.13.0" --extra-index-url "$CPU_INDEX"
  else
    $VPY -m pip install -q "torch==2.13.0"
  fi
  $VPY -W ignore -c "import torch; print('torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU build)')"
fi

if [ $want_test = 1 ]; then
  $VPY -m pip install -q -e ".[engine,dev,trl,ray]"
else
  $VPY -m pip install -q -e ".[engine]"
fi
echo "autorl installed in $VENV: $($VENV/bin/autorl --version 2>/dev/null || echo '?')"
echo "enter it with: . $VENV/bin/activate"
