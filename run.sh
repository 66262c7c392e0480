#!/usr/bin/env bash
# Set up placer in ./.venv (once, or again when pyproject.toml changes) and run a job.
#   ./run.sh demo        the main job on the built-in default (no GPU needed)
#   ./run.sh test        ruff (lint and format check), then the full test suite
#   ./run.sh placer ...  any placer command;  ./run.sh bench FILE  a benchmark
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  # System site-packages let a machine's own torch (a CUDA build on GPU machines) serve.
  "$PY" -m venv --system-site-packages .venv
fi
stamp=.venv/.placer-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up .venv (first run takes about a minute)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # The CPU wheel of torch 2.13.0; an unpinned torch would pull a multi-GB CUDA build.
  if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
job=${1:-demo}
shift || true
case "$job" in
  demo) exec .venv/bin/placer demo "$@" ;;
  test) .venv/bin/ruff check placer tests bench && .venv/bin/ruff format --check placer tests bench && exec .venv/bin/python -m pytest -n 2 -q "$@" ;;
  placer) exec .venv/bin/placer "$@" ;;
  bench) exec .venv/bin/python "$@" ;;
  *) echo "usage: ./run.sh demo|test|placer ARGS|bench FILE" >&2; exit 2 ;;
esac
