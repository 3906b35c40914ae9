#!/usr/bin/env bash
# Read the schedule files `critbatch schedule` writes with each trainer's own code
# (tests/sweeps/scaling/test_schedule_loaders.py), each in a scratch environment of its own outside the
# repository, so the project's environment is not touched:
#   olmo_core  ai2-olmo-core from PyPI (and torch, CPU)
#   levanter   levanter 1.2.dev from PyPI (1.1, the newest release, predates its batch schedule) and jax, CPU
#   megatron   megatron/core/num_microbatches_calculator.py from a Megatron-LM checkout: megatron-core 0.16.1,
#              the newest on PyPI, predates --step-batch-size-schedule, and megatron/training is not on PyPI
# Each environment also gets what the test imports of this project (its scaling modules: scipy, pydantic,
# pyyaml) and pytest; the code itself comes from the repository through PYTHONPATH.
#
# Usage: scripts/check_schedule_formats.sh [olmo_core] [levanter] [megatron]   (default: all three)
#   SCRATCH=/tmp/critbatch-formats   where the environments go (kept between runs; delete it to rebuild)
#   TORCH='torch==2.13.0'            the torch OLMo-core gets (pin a CPU wheel or index where pip would take CUDA)
#   CRITBATCH_MEGATRON_LM=DIR        a Megatron-LM checkout; unset: a shallow clone of NVIDIA/Megatron-LM
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SCRATCH=${SCRATCH:-/tmp/critbatch-formats}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
OURS=(pytest scipy pydantic pyyaml)
TEST=tests/sweeps/scaling/test_schedule_loaders.py
mkdir -p "$SCRATCH"
echo "$TORCH" >"$SCRATCH/constraints.txt"

build() { # build NAME PACKAGE...: a venv with the packages, unless it is there; says how long and how big
    local name=$1 start
    shift
    [[ -x "$SCRATCH/$name/bin/python" ]] && return 0
    start=$(date +%s)
    "$PYTHON" -m venv "$SCRATCH/$name"
    PIP_CONSTRAINT="$SCRATCH/constraints.txt" "$SCRATCH/$name/bin/pip" install -q "$@" "${OURS[@]}"
    echo "$name: installed in $(($(date +%s) - start)) s, $(du -sh "$SCRATCH/$name" | cut -f1)"
}

check() { # check NAME: the loader tests of NAME in its environment; skips are listed, not failures
    (cd "$REPO" && PYTHONPATH="$REPO" "$SCRATCH/$1/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
        -o addopts="" -rs "$TEST" -k "$1")
}

names=("$@")
[[ ${#names[@]} -eq 0 ]] && names=(olmo_core levanter megatron)
status=0
for one in "${names[@]}"; do
    case $one in
    olmo_core) build olmo_core "$TORCH" "ai2-olmo-core==3.0.0" ;;
    levanter) build levanter jax "levanter==1.2.dev1644" gitpython chex ;; # the two its wheel leaves out
    megatron)
        build megatron
        if [[ -z "${CRITBATCH_MEGATRON_LM:-}" ]]; then
            CRITBATCH_MEGATRON_LM="$SCRATCH/Megatron-LM"
            [[ -d "$CRITBATCH_MEGATRON_LM" ]] ||
                git clone -q --depth 1 https://github.com/NVIDIA/Megatron-LM "$CRITBATCH_MEGATRON_LM" ||
                echo "megatron: no checkout (the test will skip)"
        fi
        export CRITBATCH_MEGATRON_LM
        ;;
    *) echo "unknown: $one (olmo_core, levanter or megatron)" >&2 && exit 2 ;;
    esac
    echo "== $one"
    check "$one" || status=1
done
exit $status
