#!/usr/bin/env bash
# The embodied benchmark under an older loomrl and under this tree's, in turns, on this machine:
#   git archive REV loomrl benchmarks | tar -x -C out/ab_old
#   PAIRS=3 bash scripts/ab_embodied.sh out/ab_old OUTDIR [benchmarks/embodied_modes.py args...]
# Pair i runs old then new where i is odd, new then old where it is even; each run writes
# OUTDIR/ab_{old,new}_i.json and its last lines. Each side runs from its own root: Ray puts the
# driver's folder first on its workers' paths, so the workers import that side's package too.
set -eu
old=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
mkdir -p "$out"
for i in $(seq 1 "${PAIRS:-3}"); do
    order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
    for side in $order; do
        root=$PWD; [ "$side" = old ] && root=$old
        echo "=== ab $side $i: $(env -C "$root" PYTHONPATH="$root" python -c 'import loomrl; print(loomrl.__file__)')"
        env -C "$root" PYTHONPATH="$root" python benchmarks/embodied_modes.py "$@" \
            --out "$out/ab_${side}_$i.json" 2>&1 | tail -3
    done
done
