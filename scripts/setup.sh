#!/usr/bin/env bash
# Create .venv and install the project with its test, metrics and model extras (idempotent; safe to rerun).
# torch==2.13.0 first: this machine carries that CPU build on disk; any other torch spec would pull a
# multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  python -m pip install -q --upgrade pip
  python -m pip install -q torch==2.13.0
fi
python -m pip install -q -e ".[test,metrics,model]"
# the model extra (transformers) must not have replaced the CPU torch with another build
python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch changed: ' + torch.__version__)"
