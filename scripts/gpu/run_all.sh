#!/usr/bin/env bash
# GPU experiments of loomrl, one device call: bash scripts/gpu/run_all.sh [STAGE ...]
# Stages (default: pytest ipc grpo_cal grpo_auto trl): pytest ipc grpo_cal grpo_auto trl trl_both
#   wsync (weight-sync routes, 135M + 0.5B shapes) trl135 trl05 (GRPO vs TRL on GPU 0 alone,
#   calibrated temporal plan, everything resident) embodied embodied_px (pixels, MuJoCo EGL)
#   embodied_sweep (pixels at several num_envs:S, EMB_SWEEP="16:32 32:32 64:16", EMB_IMAGE=64; SKIP_MODELS=1;
#   EMB_VARIANTS="nopin pin" runs each config with env workers unpinned, then pinned; "eager pin":
#   the policy's forward eagerly, then as CUDA graphs (the default); "nobatch pin": pixels drawn env by
#   env through gymnasium, then in one pass per worker (the default); "rowwise pin": the policy's forward
#   row by row (row_block 1; not with EMB_POLICY_KWARGS), then in blocks of 8; "driver pipe": hand-offs
#   through the driver, then over sockets (cycle_handoff); EMB_ENV_CORES (default 4) cores per
#   env worker; EMB_POLICY_KWARGS a JSON object for the policy's constructor, EMB_TAG names it in
#   the output (default: its checksum))
#   embodied_state (state observations of ST_ENV, default Humanoid-v5: no renderer on the GPU,
#   the env's MuJoCo steps on host cores; ST_SWEEP num_envs:S[:cycle_batch[:modes[:env cores]]], default "64:32"; EMB_ENV_CORES,
#   EMB_ROUNDS, EMB_ITERS, EMB_MODES, EMB_EPOCHS, EMB_CAP, EMB_POLICY_KWARGS, EMB_TAG as for embodied_sweep; EMB_BATCH
#   sets cycle_batch (ready or group); CPU_SAMPLE=1 runs
#   scripts/gpu/cpu_sampler.py beside each config: where every process's CPU time went, per core)
#   overlap (env and policy costs alone and at once, and the cycle at k = 1, 2, 4 on the same
#   workers: scripts/gpu/cycle_overlap.py at OV_SWEEP="16:4:4 64:4:4", num_envs:workers:cores)
#   policy_call (where one pixel policy call spends its time, alone and beside EGL renderers; PC_SIZES
#   rows per call "1,8,32,64", PC_ROW_BLOCKS the forward's block sizes "1,8", PC_POLICY_KWARGS a JSON
#   object, PC_TAG a suffix for its output)
#   render_batch (pixels drawn env by env against one pass per worker: frames compared, steps timed
#   with RB_SIZES envs per process "4,16" in RB_PROCS processes at once "1,4")
#   policy_launches (the same call timed in fresh processes one after another: spread per launch)
#   update_profile (one PPO update of the pixel policy: copy, GAE, Adam vs fused Adam, top operators;
#   UP_SWEEP="16:32 64:16" num_envs:S)
#   core_speed (a Python loop and the policy's forward, pinned to each core in turn, in sweeps)
#   first_update (pixels: one plan's rollouts before and after its policy's first updates, at learning
#   rate 0 and 1, eagerly, with what the step holds released, the copy alone, a pause; FU_PLACEMENT
#   "temporal", FU_ENVS 96, FU_REPS 8, FU_VARIANTS all)
#   embodied_ab (embodied_state's first ST_SWEEP config, modes temporal,hybrid by default, under the
#   loomrl package in AB_OLD and under this tree's, in turns, AB_PAIRS pairs)
#   cycle_repeat (pixels: one plan's rollouts back to back, after an update, after a pause, then
#   again after a rebuild of its workers; CR_PLACEMENTS "temporal", CR_ENVS 96, CR_STEPS 32, CR_REPS 8)
# Needs (carried, ignored by git): out/gpu_wheels/ray_slim.tar.xz, out/gpu_wheels/whl/*.whl,
# out/gpu_wheels/tok/models/smollm2-135m-instruct (tokenizer only), optionally out/gpu_wheels/emb/*.whl
# and .gl/*.deb (GL loaders for rendering).
# BUDGET (seconds, default 540) bounds the whole script; each stage gets min(its cap, what is left).
# Results: $OUT/<stage>.json and $OUT/run_all.log.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/run_all.log
BUDGET=${BUDGET:-540}
T0=$(date +%s)
exec > >(tee -a "$LOG") 2>&1
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(pytest ipc grpo_cal grpo_auto trl)

left() { echo $((BUDGET - ($(date +%s) - T0))); }
cap() { local l; l=$(($(left) - 15)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stage() { # stage NAME CAP CMD...
    local name=$1 c; c=$(cap "$2"); shift 2
    if [ "$c" -lt 30 ]; then echo "=== $name: SKIPPED (only $(left)s left)"; return; fi
    echo "=== $name: start (cap ${c}s, $(left)s left) $(date +%T)"
    local t=$(date +%s)
    timeout -k 10 "$c" "$@"
    echo "=== $name: rc=$? took $(($(date +%s) - t))s"
    # A killed driver can leave its Ray processes (and their GPU memory) behind.
    python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
}

echo "=== setup $(date +%T)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ls .gl/*.deb >/dev/null 2>&1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export MUJOCO_GL=egl
DEPS=/tmp/deps
mkdir -p $DEPS
tar -xJf out/gpu_wheels/ray_slim.tar.xz -C $DEPS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $DEPS \
    out/gpu_wheels/whl/*.whl 2>&1 | tail -3
if ls out/gpu_wheels/emb/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $DEPS \
        out/gpu_wheels/emb/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=$PWD:$DEPS
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export LOOMRL_CACHE=/tmp/lcache
mkdir -p $LOOMRL_CACHE
if [ -d out/gpu_wheels/tok/models ]; then  # build_wheels.sh leaves it out: embodied stages need none
    cp -r out/gpu_wheels/tok/models $LOOMRL_CACHE/
    python3 -c "from loomrl.models import _cached_smollm2_tokenizer as t; print('smollm2 tokenizer', len(t()))" ||
        { rm -rf $LOOMRL_CACHE/models/smollm2-135m-instruct; echo "tokenizer: using the char tokenizer"; }
else
    echo "tokenizer: none carried, using the char tokenizer"
fi
python3 -c "import ray, torch, transformers; print('ray', ray.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
MODEL=/tmp/random-smollm2-135m-f32
MODEL05=/tmp/random-0.5b-f32
[ -n "${SKIP_MODELS:-}" ] ||  # embodied stages need no language model
    python3 -c "from loomrl.models import random_model_like as r; import time; t=time.time(); r('$MODEL', 'smollm2-135m'); r('$MODEL05', '0.5b'); print('models built', round(time.time()-t,1), 's')"
echo "=== setup done in $(($(date +%s) - T0))s"

for s in "${STAGES[@]}"; do
    case $s in
    pytest) stage pytest ${PYTEST_CAP:-240} python3 -m pytest -q -x -p no:cacheprovider ${PYTEST_PATHS:-tests/gpu} -o addopts= ;;
    ipc) stage ipc 150 python3 scripts/gpu/ipc_bench.py --model-dir $MODEL --out "$OUT/ipc.json" ;;
    grpo_cal) stage grpo_cal 220 python3 scripts/gpu/grpo_gpu.py --mode calibrate --model-dir $MODEL \
        --steps ${GRPO_STEPS:-4} --out "$OUT/grpo_calibrate.json" --timeout 210 ;;
    grpo_auto) stage grpo_auto 240 python3 scripts/gpu/grpo_gpu.py --mode auto --model-dir $MODEL \
        --steps ${GRPO_STEPS:-4} --out "$OUT/grpo_auto.json" --timeout 230 ;;
    trl) stage trl 200 python3 benchmarks/grpo_vs_trl.py --device cuda --only trl --model $MODEL \
        --batch 8 --group-size 8 --max-new-tokens 64 --train-micro-batch 16 --level 1 \
        --steps 3 --warmup 1 --timeout 190 --out "$OUT/trl.json" ;;
    trl_both) stage trl_both 400 python3 benchmarks/grpo_vs_trl.py --device cuda --only both --model $MODEL \
        --batch 8 --group-size 8 --max-new-tokens 64 --train-micro-batch 16 --level 1 \
        --steps 3 --warmup 1 --loomrl-plan calibrate --timeout 190 --out "$OUT/trl_both.json" ;;
    embodied) stage embodied 200 python3 benchmarks/embodied_modes.py --out "$OUT/embodied.json" ;;
    wsync) stage wsync 150 python3 scripts/gpu/weight_sync_bench.py --model-dir $MODEL --model-dir $MODEL05 \
        --out "$OUT/weight_sync.json" ;;
    trl135) stage trl135 330 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/grpo_vs_trl.py --device cuda --only both \
        --model $MODEL --batch 8 --group-size 8 --max-new-tokens 64 --train-micro-batch 16 --level 1 \
        --steps 3 --warmup 1 --loomrl-plan calibrate --offload never --timeout 200 --out "$OUT/trl135.json" ;;
    trl05) stage trl05 360 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/grpo_vs_trl.py --device cuda --only both \
        --model $MODEL05 --batch 8 --group-size 8 --max-new-tokens 64 --train-micro-batch 16 --level 1 \
        --steps 3 --warmup 1 --loomrl-plan calibrate --offload never --timeout 220 --out "$OUT/trl05.json" ;;
    embodied_px) stage embodied_px ${EMB_CAP:-280} python3 benchmarks/embodied_modes.py --device cuda --pixels \
        --image-size 64 --num-envs ${EMB_ENVS:-16} --steps ${EMB_STEPS:-32} --iterations ${EMB_ITERS:-4} --rounds ${EMB_ROUNDS:-1} --env-cores 4 --out "$OUT/embodied_px.json" ;;
    embodied_sweep) for c in ${EMB_SWEEP:-16:32 32:32 64:16}; do  # num_envs:S per config
        e=${c%%:*}; st=${c##*:}
        for v in ${EMB_VARIANTS:-pin}; do  # pin: env workers on cores of their own; nopin: not
            fl=(); sfx=""
            [ "$v" = nopin ] && { fl+=(--no-pin); sfx="_nopin"; }
            [ "$v" = eager ] && { fl+=(--no-graphs); sfx="_eager"; }
            [ "$v" = eagerstep ] && { fl+=(--no-step-graph); sfx="_eagerstep"; }
            [ "$v" = nobatch ] && { fl+=(--no-batch-render); sfx="_nobatch"; }
            [ "$v" = driver ] && { fl+=(--handoff driver); sfx="_driver"; }
            [ "$v" = pipe ] && { fl+=(--handoff pipe); sfx="_pipe"; }
            if [ "$v" = rowwise ]; then
                [ -n "${EMB_POLICY_KWARGS:-}" ] && { echo "=== rowwise: not with EMB_POLICY_KWARGS (it would override row_block)"; continue; }
                fl+=(--policy-kwargs '{"row_block": 1}'); sfx="_rowwise"
            fi
            img=${EMB_IMAGE:-64}; [ "$img" != 64 ] && sfx="_i${img}${sfx}"
            [ "${EMB_ENV_CORES:-4}" != 4 ] && sfx="_c${EMB_ENV_CORES}${sfx}"
            if [ -n "${EMB_POLICY_KWARGS:-}" ]; then  # one argument, spaces and brackets kept
                fl+=(--policy-kwargs "$EMB_POLICY_KWARGS")
                sfx="_pk${EMB_TAG:-$(printf %s "$EMB_POLICY_KWARGS" | cksum | cut -d' ' -f1)}${sfx}"
            fi
            stage "embodied_px_e${e}_s${st}${sfx}" ${EMB_CAP:-258} python3 benchmarks/embodied_modes.py --device cuda \
                --pixels --image-size "$img" --num-envs "$e" --steps "$st" --iterations ${EMB_ITERS:-4} --rounds ${EMB_ROUNDS:-1} \
                --modes ${EMB_MODES:-temporal,hybrid,auto} --epochs ${EMB_EPOCHS:-2} --env-cores ${EMB_ENV_CORES:-4} \
                ${fl[@]+"${fl[@]}"} --out "$OUT/embodied_px_e${e}_s${st}${sfx}.json"
        done
    done ;;
    embodied_state) for c in ${ST_SWEEP:-64:32}; do  # state observations of ST_ENV, num_envs:S[:batch[:modes[:cores]]] per config
        IFS=: read -r e st cb cm cc <<< "$c"
        cc=${cc:-${EMB_ENV_CORES:-4}}
        name="embodied_state_${ST_ENV:-Humanoid-v5}_e${e}_s${st}_c${cc}"
        pk=()  # EMB_POLICY_KWARGS as for embodied_sweep (e.g. '{"row_block": 32}'), named by EMB_TAG
        if [ -n "${EMB_POLICY_KWARGS:-}" ]; then
            pk=(--policy-kwargs "$EMB_POLICY_KWARGS")
            name+="_pk${EMB_TAG:-$(printf %s "$EMB_POLICY_KWARGS" | cksum | cut -d' ' -f1)}"
        fi
        cb=${cb:-${EMB_BATCH:-}}; cm=${cm:-${EMB_MODES:-temporal,hybrid,auto}}
        [ -n "$cb" ] && { pk+=(--batch "$cb"); name+="_b$cb"; }  # cycle_batch
        [ "$cm" != temporal,hybrid,auto ] && name+="_m${cm//,/-}"
        spid=""
        if [ -n "${CPU_SAMPLE:-}" ]; then  # host-wide CPU samples beside the benchmark
            python3 scripts/gpu/cpu_sampler.py --seconds ${EMB_CAP:-258} --out "$OUT/cpu_$name.json" & spid=$!
        fi
        stage "$name" ${EMB_CAP:-258} python3 benchmarks/embodied_modes.py --device cuda --env "${ST_ENV:-Humanoid-v5}" \
            --num-envs "$e" --steps "$st" --iterations ${EMB_ITERS:-4} --rounds ${EMB_ROUNDS:-1} \
            --modes "$cm" --epochs ${EMB_EPOCHS:-2} --env-cores "$cc" \
            ${pk[@]+"${pk[@]}"} --out "$OUT/$name.json"
        [ -n "$spid" ] && { kill -TERM "$spid"; wait "$spid"; }
    done ;;
    embodied_ab) # the same embodied_state config under an older loomrl package (AB_OLD, a folder
        # holding loomrl/ and benchmarks/, e.g. from `git archive REV loomrl benchmarks | tar -x -C
        # out/ab_old`) and this one, in turns (AB_PAIRS pairs, old first in odd pairs):
        # scripts/ab_embodied.sh, each run capped at EMB_CAP
        IFS=: read -r e st cb cm cc <<< "${ST_SWEEP:-64:32}"
        cc=${cc:-${EMB_ENV_CORES:-4}}; cm=${cm:-${EMB_MODES:-temporal,hybrid}}
        n=$((2 * ${AB_PAIRS:-2}))
        stage embodied_ab $((n * (${EMB_CAP:-258} + 10))) env PYTHON=python3 CAP=${EMB_CAP:-258} \
            PAIRS=${AB_PAIRS:-2} bash scripts/ab_embodied.sh "${AB_OLD:-out/ab_old}" "$OUT" \
            --device cuda --env "${ST_ENV:-Humanoid-v5}" --num-envs "$e" --steps "$st" \
            --iterations ${EMB_ITERS:-4} --rounds 1 --modes "$cm" --epochs ${EMB_EPOCHS:-2} \
            --env-cores "$cc" ;;
    overlap) for c in ${OV_SWEEP:-16:4:4 64:4:4}; do  # num_envs:env workers:cores per worker
        IFS=: read -r e w co <<< "$c"
        stage "overlap_e${e}_w${w}${OV_RENDER:+_r$OV_RENDER}" ${OV_CAP:-150} python3 scripts/gpu/cycle_overlap.py --num-envs "$e" \
            --env-workers "$w" --env-cores "$co" --steps ${OV_STEPS:-32} ${OV_FLAGS:-} \
            ${OV_RENDER:+--render-device "$OV_RENDER"} --out "$OUT/overlap_e${e}_w${w}${OV_RENDER:+_r$OV_RENDER}.json"
    done ;;
    render_batch) stage render_batch ${RB_CAP:-150} python3 scripts/gpu/render_batch.py --sizes ${RB_SIZES:-4,16} \
        --procs ${RB_PROCS:-1,4} --out "$OUT/render_batch.json" ;;
    policy_launches) stage policy_launches 200 python3 scripts/gpu/policy_launches.py --launches ${PL_LAUNCHES:-8} \
        --out "$OUT/policy_launches.json" ;;
    cycle_repeat) for pl in ${CR_PLACEMENTS:-temporal}; do  # one plan's rollouts: updates between, a rebuild
        stage "cycle_repeat_${pl}_e${CR_ENVS:-96}" ${CR_CAP:-90} python3 scripts/cycle_repeat.py --device cuda --pixels \
            --num-envs ${CR_ENVS:-96} --steps ${CR_STEPS:-32} --env-cores ${EMB_ENV_CORES:-4} --placement "$pl" \
            --reps ${CR_REPS:-8} --rebuild --out "$OUT/cycle_repeat_${pl}_e${CR_ENVS:-96}.json"
    done ;;
    first_update) stage "first_update_${FU_PLACEMENT:-temporal}_e${FU_ENVS:-96}" ${FU_CAP:-90} python3 scripts/gpu/first_update.py \
        --device cuda --pixels --num-envs ${FU_ENVS:-96} --env-cores ${EMB_ENV_CORES:-4} --placement ${FU_PLACEMENT:-temporal} \
        --reps ${FU_REPS:-8} ${FU_VARIANTS:+--variants "$FU_VARIANTS"} --out "$OUT/first_update_${FU_PLACEMENT:-temporal}_e${FU_ENVS:-96}.json" ;;
    core_speed) stage core_speed 200 python3 scripts/gpu/core_speed.py --sweeps ${CS_SWEEPS:-3} --out "$OUT/core_speed.json" ;;
    policy_call) stage policy_call${PC_TAG:-} 150 python3 scripts/gpu/policy_call.py --renderers ${PC_RENDERERS:-4} \
        --row-blocks ${PC_ROW_BLOCKS:-1,8} \
        ${PC_SIZES:+--sizes "$PC_SIZES"} ${PC_POLICY_KWARGS:+--policy-kwargs "$PC_POLICY_KWARGS"} \
        --out "$OUT/policy_call${PC_TAG:-}.json" ;;
    update_profile) for c in ${UP_SWEEP:-16:32 64:16}; do  # num_envs:S per shape
        e=${c%%:*}; st=${c##*:}
        stage "update_profile_e${e}_s${st}" 120 python3 scripts/gpu/update_profile.py --num-envs "$e" --steps "$st" \
            --out "$OUT/update_profile_e${e}_s${st}.json"
    done ;;
    *) echo "unknown stage $s" ;;
    esac
done
echo "=== all done in $(($(date +%s) - T0))s"
ls -la "$OUT"
