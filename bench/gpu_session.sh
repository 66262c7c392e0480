#!/usr/bin/env bash
# The checks that need a GPU machine, in one run of about 8 to 10 minutes: fidelity on its quiet CPU cores
# (bench/fidelity.py, recorded; its table shows the prediction with and without the calibrated cost of the
# operation right after a message, and it calibrates with a probe run, --probe, and compares that message cost
# with the streams'), that cost's probe, the CUDA paths (bench/cuda_check.py; `placer run --verify` on a
# GPU, SGD and Adam), the cost model against CUDA kernel times (bench/capture.py), and the test suite under that
# machine's torch (cut short when time runs out). FIDELITY_TIMEOUT, CAPTURE_TIMEOUT and TESTS_TIMEOUT (seconds) bound
# the three long parts; RECEIVE_TIMEOUT, CAPTURE_TIMEOUT or TESTS_TIMEOUT of 0 skips that part.
#
# The machine has torch but not every dependency: first, on the development machine, download the
# missing ones as cp312 wheels into ./.whl (git-ignored through .git/info/exclude), e.g.
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pymetis==2025.2.2 ortools==9.15.6755 protobuf==6.33.6 immutabledict
# then copy `.whl` there beside the tree and run this script. Everything it measures lands in $OUT (or ./gpu-out).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-gpu-out}
py=${PYTHON:-python3}     # the machine's python with torch
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nproc; uptime; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# The ranks of one run compute up to 1.2x apart: print the CPU topology.
lscpu | grep -i -E "model name|socket|core|thread|numa|cache" || true
echo "== fidelity (quiet cores: run before anything else loads the machine)"
# FIDELITY_ARGS picks a subset or rounds, e.g. FIDELITY_ARGS="--rounds 3" (the seven models in 3 rounds take
# about 8 minutes on 16 cores of an H200 machine), with FIDELITY_TIMEOUT (seconds, default 300).
timeout "${FIDELITY_TIMEOUT:-300}" "$py" bench/fidelity.py --steps 10 --plans expert,metis,round_robin --probe \
  --record /tmp/fidelity-record ${FIDELITY_ARGS:-} 2>&1 | tee "$out/fidelity.log"
# Without the simulated traces (the replay makes them again); the measured ones give each run's step end.
tar cJf "$out/fidelity-record.tar.xz" -C /tmp --exclude '*-simulated.json' fidelity-record
# A part whose *_TIMEOUT is 0 is skipped (`timeout 0` would mean no limit).
if [ "${RECEIVE_TIMEOUT:-60}" != 0 ]; then
  echo "== an operation right after a message (bench/op_slowdown.py --part receive)"
  timeout "${RECEIVE_TIMEOUT:-60}" "$py" bench/op_slowdown.py --part receive --steps 40 2>&1 | tee "$out/receive.log"
fi
echo "== cuda paths"
timeout 90 "$py" bench/cuda_check.py --steps 3 --batch 8 2>&1 | tee "$out/cuda_check.log"
echo "== placer run --verify on the GPU"
spec='zoo:resnet50?depth=14&image_size=32&width=8&classes=10'
for optimizer in sgd adam "sgd --momentum 0.9 --weight-decay 1e-4"; do   # unquoted below: flags of their own
  echo "-- --optimizer $optimizer"
  "$py" -m placer capture "$spec" --batch 8 --optimizer $optimizer -o /tmp/verify-graph.json &&
  "$py" -m placer plan /tmp/verify-graph.json --cluster 2xV100-nvlink --algorithm expert -o /tmp/verify-plan.json &&
  timeout 60 "$py" -m placer run "$spec" --plan /tmp/verify-plan.json --optimizer $optimizer --steps 5 \
    --devices cuda:0,cuda:0 --verify
done 2>&1 | tee "$out/verify.log"
if [ "${CAPTURE_TIMEOUT:-120}" != 0 ]; then
  echo "== the cost model against CUDA kernel time (bench/capture.py part 2)"
  timeout "${CAPTURE_TIMEOUT:-120}" "$py" bench/capture.py --device cuda:0 --skip-capture --batch 32 --max-gflop 100000 \
    --repeats 3 --models "${CAPTURE_MODELS:-lenet,alexnet,vgg19,resnet50}" 2>&1 | tee "$out/capture.log"
fi
if [ "${TESTS_TIMEOUT:-130}" != 0 ]; then
  echo "== tests under this machine's torch"
  timeout "${TESTS_TIMEOUT:-130}" "$py" -m pytest -n "$(nproc)" -q -p no:cacheprovider --maxfail=25 > "$out/tests.log" 2>&1
  tail -5 "$out/tests.log"
fi
