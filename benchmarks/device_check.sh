#!/usr/bin/env bash
# The GPU checks of one lent device machine, in one call (the workplace's `device` tool).
#
#   bash benchmarks/device_check.sh prep   # here: wheels the image lacks -> .whl/, the four
#                                          # benchmark prototxts -> .gpu/models/ (both ignored
#                                          # via .git/info/exclude; carry them: [".whl", ".gpu"])
#   bash benchmarks/device_check.sh run    # there: golden cases in GPU mode, the whole suite
#                                          # (CUDA variants included), the GPU benchmark rows
#
# `run` writes golden_gpu.log, fresh.log, tests.log, bench.log, results_gpu.md, profile.log,
# compiled_profile.log and compiled_<net>.md/.log under $OUT, packed into one logs.tgz at the
# end (the device tool brings back only so many files), and prints the failures, the tables
# and the profiles' summaries. Each part has its own time limit (GOLDEN_S, TESTS_S, BENCH_S,
# PROFILE_S seconds), and none runs past DEADLINE_S (default 540) from the start, so that one
# call fits the device time: give it a timeout_s of DEADLINE_S + 30. On an H200 the parts
# took about 25, 30, 220 (the whole suite, cut at 98%; 30 with TESTS_K), 10 and 45 s, the
# compiled profile of two nets 90 s, the compiled rows of one net 135-195 s.
#   TESTS_K           narrows the suite (pytest -k; "cuda or gpu": the ids run on the GPU)
#   BENCH, REPEAT     the eager sections of run.py, and its repeats
#   COMPILED_PROFILE  nets for `profile_gpu.py --compiled` (default: none)
#   COMPILED_NETS     nets for the compiled handwritten rows, one run.py call each, in
#                     whatever time the deadline leaves (default: none)
# The image's python3 is 3.12 with its own torch (2.11.0+cu130 when last read): its torch,
# not CI's pin, runs the checks.
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
prep)
    # protobuf >= 7.35 (caffe_pb2's gencode), lmdb, plyvel, pydot, grpcio-tools: not in the
    # image, or too old there (its list: /work/.library/device/KINDS.md)
    mkdir -p .whl .gpu/models
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    for spec in protobuf==7.36.2 lmdb==3.0.0 plyvel==1.5.1 pydot==4.0.1 grpcio==1.85.3 \
        grpcio-tools==1.85.1; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$spec" \
            || exit 1
    done
    for rel in bvlc_reference_caffenet/deploy.prototxt bvlc_googlenet/deploy.prototxt \
        resnet50_kaiminghe/ResNet-50-deploy.prototxt mobilenet_v2/mobilenet_v2_deploy.prototxt; do
        mkdir -p ".gpu/models/$(dirname "$rel")"
        cp "../shared/models/$rel" ".gpu/models/$rel" || exit 1
    done
    du -sh .whl .gpu
    ;;
run)
    : "${OUT:?run on the device machine, where OUT names the folder that comes back}"
    export PYTHONUNBUFFERED=1
    t0=$(date +%s)
    # seconds a part may run: its own limit, or what is left before the deadline
    budget() {
        local left=$(( ${DEADLINE_S:-540} - ($(date +%s) - t0) ))
        (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site:$PWD
    nvidia-smi -L
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    echo "== golden cases in GPU mode"
    TORCHCAFFE_GOLDEN_MODE=gpu timeout "$(budget "${GOLDEN_S:-60}")" python3 -m pytest -n 16 -v \
        -p no:cacheprovider tests/test_conformance.py -rfE > "$OUT/golden_gpu.log" 2>&1
    grep -oE "(FAILED|ERROR) tests/[^ ]*" "$OUT/golden_gpu.log" | sort -u | head -40
    tail -1 "$OUT/golden_gpu.log"
    # compiled training, one golden case per fresh process: on torch 2.11 eltwise_sum_coeff
    # lost its coefficients when compiled first in a process and passed inside the suite
    echo "== compiled training in fresh processes"
    for case in layers/eltwise_sum_coeff nets/resnet_bottleneck_train nets/lenet; do
        timeout "$(budget 60)" python3 -m pytest -q -p no:cacheprovider --tb=line \
            "tests/net/test_golden_graphs.py::test_golden_net_trains_compiled[$case]" \
            >> "$OUT/fresh.log" 2>&1
        echo "$case: $(tail -1 "$OUT/fresh.log")"
    done
    echo "== the whole suite at $(( $(date +%s) - t0 )) s"
    timeout "$(budget "${TESTS_S:-220}")" python3 -m pytest -n 16 -v -p no:cacheprovider \
        --timeout 120 ${TESTS_K:+-k "$TESTS_K"} tests -rfE > "$OUT/tests.log" 2>&1
    grep -oE "(FAILED|ERROR) tests/[^ ]*" "$OUT/tests.log" | sort -u | head -40
    tail -1 "$OUT/tests.log"
    echo "== benchmarks at $(( $(date +%s) - t0 )) s"
    mkdir -p ../shared && ln -sfn "$PWD/.gpu/models" ../shared/models
    timeout "$(budget "${BENCH_S:-150}")" python3 benchmarks/run.py --device cuda \
        --only "${BENCH:-handwritten,caffe_face,memory}" --no-compile \
        --repeat "${REPEAT:-15}" --out "$OUT/results_gpu.md" > "$OUT/bench.log" 2>&1
    tail -3 "$OUT/bench.log"
    grep "^|" "$OUT/results_gpu.md"
    echo "== profile at $(( $(date +%s) - t0 )) s"
    timeout "$(budget "${PROFILE_S:-80}")" python3 benchmarks/profile_gpu.py --rounds 30 --tops 12 \
        > "$OUT/profile.log" 2>&1
    grep -E "^== |^synced|^kernels" "$OUT/profile.log"
    if [[ -n "${COMPILED_PROFILE:-}" ]]; then
        echo "== compiled profile at $(( $(date +%s) - t0 )) s"
        timeout "$(budget 300)" python3 benchmarks/profile_gpu.py --compiled \
            --nets "$COMPILED_PROFILE" --rounds 20 --tops 15 > "$OUT/compiled_profile.log" 2>&1
        grep -E "^== |^synced|^kernels" "$OUT/compiled_profile.log"
    fi
    # compiled rows: each net's own call, so a net whose compile runs out of time costs only
    # its own rows (run.py rewrites its table after each row)
    for net in $(tr , " " <<< "${COMPILED_NETS:-}"); do
        echo "== compiled $net at $(( $(date +%s) - t0 )) s"
        timeout "$(budget 600)" python3 benchmarks/run.py --device cuda --only handwritten \
            --nets "$net" --repeat "${REPEAT:-15}" --out "$OUT/compiled_$net.md" \
            > "$OUT/compiled_$net.log" 2>&1
        tail -2 "$OUT/compiled_$net.log"
        grep "compiled" "$OUT/compiled_$net.md" 2>/dev/null
    done
    echo "== done at $(( $(date +%s) - t0 )) s"
    # the device tool brings back only so many files: one archive of them all
    (cd "$OUT" && shopt -s nullglob && logs=(*.log *.md) && ((${#logs[@]})) \
        && tar czf logs.tgz --remove-files -- "${logs[@]}") || true
    ;;
*)
    echo "usage: bash benchmarks/device_check.sh prep|run" >&2
    exit 2
    ;;
esac
