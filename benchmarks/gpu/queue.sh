#!/usr/bin/env bash
# The measurements waiting for a lent GPU, most wanted first: sweeps (chosen on dev, three test
# seeds against a baseline). benchmarks/gpu/run.sh runs it from the kit's clean clone:
#
#   BUDGET=540 bash benchmarks/gpu/run.sh 'bash benchmarks/gpu/queue.sh'
#
# A sweep keeps every finished run in $RESULTS, so when BUDGET stops the queue, the same call on
# the same warm machine resumes it; a fresh machine starts over (its $RESULTS is empty). Each
# finished sweep's file comes back in results.tar. Remove a line once its results are committed.
set -euo pipefail
S="python3 -m benchmarks.sweep --data $DATA/scifact --out $RESULTS --seeds 3"
# issue 24: SVDR's in-training negative retrieval, off against on (2 dev + 6 test runs, each step
# encodes the drawn passages too); at 60 steps on the CPU test showed no difference (docs/svdr.md)
$S --name svdr-retrieved-negatives --base svdr-beta --baseline svdr-beta \
    --grid 'retriever.svdr.retrieved_negatives=[0, 1]'
# issue 24: does beta search gain from longer training? (its query-to-binary term was still falling
# at 240 steps: docs/svdr.md); 3 dev + 6 test runs, up to 4x a run's training
$S --name svdr-beta-steps --base svdr-beta --baseline svdr-beta --grid 'train.max_steps=[240, 480, 960]'
# issue 22: does choosing the state on dev (train.dev_every, scored every 60 of 240 steps) beat the
# last state? dev can only pick it (the last state is among its candidates): the test seeds decide
$S --name ct-hn-dev-selection --base ct-hn --baseline ct-hn --grid 'train.dev_every=[60]'
