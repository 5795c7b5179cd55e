#!/usr/bin/env bash
# The embodied benchmark under an older loomrl and under this tree's, in turns, on one machine:
#   git archive REV loomrl benchmarks | tar -x -C out/ab_old
#   PAIRS=3 bash scripts/ab_embodied.sh out/ab_old OUTDIR [benchmarks/embodied_modes.py args...]
# Pair i runs old then new where i is odd, new then old where it is even; each run writes
# OUTDIR/ab_{old,new}_i.json. Each side runs from its own root, its folder first on PYTHONPATH:
# Ray puts the driver's folder first on its workers' paths, so the workers import that side's
# package too. PYTHON (default python) runs the benchmark; CAP (seconds) bounds each run.
set -u
old=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
mkdir -p "$out"
for i in $(seq 1 "${PAIRS:-3}"); do
    order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
    for side in $order; do
        root=$PWD; [ "$side" = old ] && root=$old
        path="$root${PYTHONPATH:+:$PYTHONPATH}"
        echo "=== ab $side $i: $(env -C "$root" PYTHONPATH="$path" "${PYTHON:-python}" -c 'import loomrl; print(loomrl.__file__)') $(date +%T)"
        t=$(date +%s)
        env -C "$root" PYTHONPATH="$path" ${CAP:+timeout -k 10 "$CAP"} "${PYTHON:-python}" \
            benchmarks/embodied_modes.py "$@" --out "$out/ab_${side}_$i.json"
        rc=$?
        echo "=== ab $side $i: rc=$rc took $(($(date +%s) - t))s"
        # A driver stopped by CAP can leave its Ray processes behind, busy on the cores.
        [ "$rc" -ne 0 ] && "${PYTHON:-python}" -m ray.scripts.scripts stop --force >/dev/null 2>&1
    done
done
