#!/usr/bin/env bash
# The GPU check (docs/dspark.md, "Checking it on a GPU"): at most 5 minutes on one GPU, on a machine with
# Python 3.12, torch with CUDA and transformers, and no package index. The two wheels the project needs
# beyond those travel in the ignored .whl/ (fetched where an index is reachable with:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp --no-deps \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     posix_ipc msgspec -d .whl
# ). Prints one JSON line (scripts/device_check.py); exit 0 when lossless. `--device cpu`: a dry run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import posix_ipc, msgspec" 2>/dev/null; then
  compgen -G ".whl/*.whl" >/dev/null || { echo "device_check: posix_ipc or msgspec missing and no .whl/ wheels" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps .whl/*.whl
fi
if ! "$PY" -c "import dspark_proxy, engine_shim, dspark_proxy.round._fastround" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
fi
"$PY" -c "import torch, transformers, safetensors; print('device_check: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" >&2
exec timeout 300 "$PY" scripts/device_check.py "$@"
