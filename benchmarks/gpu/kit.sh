#!/usr/bin/env bash
# Pack what a benchmark run on a lent GPU machine needs, for a machine without network access whose
# calls carry at most 64 MiB each: the wheels its image lacks (benchmarks/gpu/wheels.py), the
# dataset, and a git bundle of this clean commit (so the rows it writes name the commit they
# measured). The pack is cut into parts of at most 56 MiB, one folder per device call:
#
#   bash benchmarks/gpu/kit.sh [DATA_DIR ...]     # default ../shared/data/scifact; writes .gpu/part1..N
#
# then, on the device machine, calls 1..N-1 `mkdir -p /tmp/kit && cp .gpu/partK/* /tmp/kit/` with
# carry [".gpu/partK"], and the last `cp .gpu/partN/* /tmp/kit/ && bash benchmarks/gpu/run.sh ['COMMAND']`
# (no COMMAND: the queue, benchmarks/gpu/queue.yaml; docs/benchmarks.md, "On a GPU machine without
# network access"). A warm machine keeps /tmp only for a short while between calls, so make them
# back to back.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu
part_mib=56
[ $# -gt 0 ] || set -- ../shared/data/scifact
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "kit.sh: uncommitted changes to tracked files: commit first, so the GPU rows name the code they ran" >&2
    exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels" "$stage/data"
.venv/bin/python benchmarks/gpu/wheels.py > "$stage/requirements.txt"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$stage/wheels" -r "$stage/requirements.txt" \
    2> >(grep -v "is neither a file nor a directory" >&2)  # this machine's pip.conf names a local index that may be absent
for data in "$@"; do
    [ -f "$data/corpus.jsonl" ] || { echo "kit.sh: $data is not a BEIR folder (no corpus.jsonl)" >&2; exit 1; }
    cp -rL "$data" "$stage/data/$(basename "$data")"
done
git bundle create -q "$stage/repo.bundle" HEAD main

rm -rf "$out" && mkdir -p "$out"
tar -C "$stage" -cf - requirements.txt wheels data repo.bundle | split -b "${part_mib}M" -d -a 2 - "$stage/kit.tar.part"
n=0
for chunk in "$stage"/kit.tar.part*; do
    n=$((n + 1))
    mkdir -p "$out/part$n" && mv "$chunk" "$out/part$n/"
done
echo "$out: $n part(s), $(du -sh "$out" | cut -f1), commit $(git rev-parse --short HEAD), $(wc -l < "$stage/requirements.txt") wheels"
for k in $(seq 1 $((n - 1))); do
    echo "device call $k: mkdir -p /tmp/kit && cp .gpu/part$k/* /tmp/kit/        carry [\".gpu/part$k\"]"
done
echo "device call $n: mkdir -p /tmp/kit && cp .gpu/part$n/* /tmp/kit/ && BUDGET=540 bash benchmarks/gpu/run.sh ['COMMAND']   carry [\".gpu/part$n\"], timeout_s 600"
