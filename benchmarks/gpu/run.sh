#!/usr/bin/env bash
# On a lent GPU machine: run COMMAND from a clean clone of the commit benchmarks/gpu/kit.sh packed,
# with the kit's wheels on PYTHONPATH, and send what it wrote under $RESULTS back as
# $OUT/results.tar (the device tool returns files at most two folders down, results nest deeper).
# Without COMMAND it runs the sweeps waiting for a GPU, benchmarks/gpu/queue.yaml (queue.py).
#
#   bash benchmarks/gpu/run.sh 'python3 -m benchmarks.sweep --data $DATA/scifact --out $RESULTS ...'
#
#   BUDGET=540 bash benchmarks/gpu/run.sh         # the queue; stopped after 540 s, still sends the results
#
# Expects every part of the kit copied into /tmp/kit (kit.sh prints the calls). The first call
# unpacks and installs (about a minute); later calls on the same warm machine reuse that. BUDGET
# (seconds) keeps COMMAND inside the device call's limit: a call killed at its limit returns nothing,
# one stopped by BUDGET returns what was finished, and a sweep started again resumes from there.
set -euo pipefail
kit=/tmp/kit
if [ ! -e "$kit/.ready" ]; then
    cat "$kit"/kit.tar.part* | tar -x -C "$kit"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$kit"/wheels/*.whl
    rm -rf /tmp/clone && git clone -q -b main "$kit/repo.bundle" /tmp/clone
    touch "$kit/.ready"
fi
# XLA_PYTHON_CLIENT_PREALLOCATE: a JAX backend that something in the image's stack starts would
# otherwise hold 75 % of the GPU (tests/conftest.py sets the same)
export PYTHONPATH=/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    GX_ANALYTICS_ENABLED=false PYTHONUNBUFFERED=1 DATA="$kit/data" RESULTS=/tmp/results \
    TQDM_MININTERVAL=60  # progress bars redraw at most once a minute: the call returns only its output's tail
mkdir -p "$RESULTS"
cd /tmp/clone
echo "commit $(git rev-parse --short HEAD); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo 'no GPU')"
status=0
command=${1:-python3 benchmarks/gpu/queue.py}
if [ -n "${BUDGET:-}" ]; then
    timeout "$BUDGET" bash -c "$command" || status=$?
    [ "$status" -ne 124 ] || echo "run.sh: stopped after BUDGET=$BUDGET s; what finished comes back"
else
    bash -c "$command" || status=$?
fi
tar -C "$RESULTS" -cf "${OUT:-/tmp}/results.tar" .
find "$RESULTS" -type f -name '*.json' | sort
exit $status
