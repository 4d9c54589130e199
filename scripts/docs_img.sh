#!/usr/bin/env bash
# Regenerate the pictures in docs/img/ (README.md and docs/performance.md show them): quick runs of
# bench, eval and chaos with --plot (the plot extra; scripts/setup.sh installs it). A few minutes on a
# 2-core machine; the figures are that machine's, at that moment (docs/performance.md says how to read them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-docs/img}
"$PY" -m dspark_proxy.cli bench --quick --sections handoff,gil,scaling --plot "$OUT" --quiet > /dev/null
"$PY" -m dspark_proxy.cli eval --quick --plot "$OUT" > /dev/null
"$PY" -m dspark_proxy.cli chaos --duration 60 --passes 2 --quiet --plot "$OUT" > /dev/null
ls -l "$OUT"
