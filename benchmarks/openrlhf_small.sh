#!/usr/bin/env bash
# The GPU recipes on real OpenRLHF 0.10.x: make the model (MODEL=small: the warm-started 34 M Llama of
# openrlhf-small.yaml, the default; MODEL=smollm2: SmolLM2-135M-Instruct of openrlhf-smollm2.yaml, from its wheel),
# time one trial, sweep the learning rate, run studies. In an environment with openrlhf, ray[default], vllm,
# deepspeed and a GPU:
#   bash benchmarks/openrlhf_small.sh OUTDIR PHASE...
# phases: make (the model and probe sets), evalbase (the base model judged per item on both probe sets, by Hugging
# Face generate and by vLLM, timed), one (one trial alone, timed; ONE_SET=key=value), oneb (the same in
# the background, in its own session), sweep (LRS="1e-6 1e-5 1e-4 1e-3", one trial each, at once on the one GPU),
# study (SEEDS="0 1" studies of BUDGET, at once, in the background; `wait` collects them; GPUS="0 1" gives each
# study its own card, in turn; STUDY_PAR=4 packs that many trials on it), par (one study of BUDGET at --parallel PAR on the cards PAR_GPUS, in the background,
# beside any others; PAR_NAME names its workspace /tmp/ws-NAME, default par), wait (WAIT_S: until no study
# of any /tmp/ws-* workspace runs, then each one's ledger, phases and a trial's logs), split (one trial with the actor and the vLLM engine on separate cards,
# SPLIT_GPUS), nodes (a two-node Ray cluster on one host, NODES_GPUS="0 1": a head and a second node a card each,
# and a --parallel NODES_PAR (default 2) study of BUDGET through --ray-address, in the background; where each job ran
# goes to OUTDIR/nodes-placement.jsonl; NODES_PACK=k counts each card as k GPUs, for trials of gpus_per_trial 1/k), oom (a study on a card another process has filled, OOM_GPU), kill9 (kill -9 of a --parallel K9_PARALLEL
# (default 2) controller K9_AFTER s after that many jobs run, then --resume of K9_RESUME (none: no resume), K9_GPUS; K9_WS
# kills a resumed study of that workspace instead; the GPU processes and the heads' process groups are listed before and after), promote
# (`autorl promote` of a finished study, PROMOTE_WS, on PROMOTE_GPU; PROMOTE_REPEATS fresh seeds a side,
# PROMOTE_PARALLEL of those runs at once, PROMOTE_ARGS more of its arguments; its status once a minute, the full run's weights on disk). SETS="key=value ..." passes --set to every study (e.g. gpus_per_trial=0.5
# with PAR=2 PAR_GPUS=0: two trials packed on one card); FULL="k: v, ..." gives every new workspace's recipe a full
# block (e.g. FULL="save_steps: 8, save_hf_ckpt: true, disable_ds_ckpt: true": a promoted full run saves and evaluates
# checkpoints as it trains). vllmkill (a trial's vLLM engine SIGKILLed at its second step), warmkill (a warm pool's
# server SIGKILLed between two trials): each the study's ledger, triage, logs and the processes left afterwards.
set -uo pipefail
MODEL=${MODEL:-small}
case "$MODEL" in
  small) RECIPE=openrlhf-small; INPUTS=/tmp/autorl-openrlhf-small ;;
  smollm2) RECIPE=openrlhf-smollm2; INPUTS=/tmp/autorl-smollm2 ;;
  smollm2-embedded) RECIPE=smollm2-embedded; INPUTS=/tmp/autorl-smollm2 ;;  # the same model, no OpenRLHF
  *) echo "MODEL must be small, smollm2 or smollm2-embedded" >&2; exit 2 ;;
esac
OUT=${1:-/tmp/openrlhf-$MODEL}; mkdir -p "$OUT"; SMALL=${SMALL:-$INPUTS}
cd "$(dirname "$0")/.." || exit 1  # the package root: a checkout beside it must not shadow it
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REC=$(python3 -c "import autorl.data as d; print(d.shipped('recipes/$RECIPE.yaml'))")
t() { echo "== $(date +%T) $*"; }
sample_gpu() {  # GPU utilisation and memory once a second, until the phase ends
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 1 >> "$OUT/gpu-$1.csv" 2>/dev/null &
  echo $!
}
workspace() {  # a fresh workspace at $1 with the recipe's paths pointing at $SMALL
  rm -rf "$1"; python3 -m autorl.cli init "$1" >/dev/null || exit 1
  git -C "$1" config user.email bench@example.invalid; git -C "$1" config user.name bench
  sed "s#$INPUTS#$SMALL#g" "$REC" > "$1/recipes/small.yaml"
  if [ -n "${FULL:-}" ]; then echo "full: {$FULL}" >> "$1/recipes/small.yaml"; fi
}
phase_make() {
  t make; s=$(date +%s)
  if [ "$MODEL" = smollm2 ]; then
    python3 -m autorl.toolkit.pretrained smollm2 "$SMALL" --dtype bf16 > "$OUT/make.log" 2>&1
  elif [ "$MODEL" = smollm2-embedded ]; then  # the embedded engine trains the fp32 folder under bf16 autocast
    python3 -m autorl.toolkit.pretrained smollm2 "$SMALL" --dtype fp32 > "$OUT/make.log" 2>&1
  else
    python3 -m autorl.backends.openrlhf.small "$SMALL" > "$OUT/make.log" 2>&1
  fi
  echo "make exit $? in $(( $(date +%s) - s )) s"
  tail -9 "$OUT/make.log"; cp "$SMALL/warmup.json" "$SMALL/conversion.json" "$OUT/" 2>/dev/null
}
phase_evalbase() {  # the base model judged per item on both probes, by each engine, as a trial's eval is
  local max_new; max_new=$(python3 -c "import yaml; print(yaml.safe_load(open('$REC'))['train']['max_new_tokens'])")
  local chat; chat=$(python3 -c "import yaml; print('--chat-template' if yaml.safe_load(open('$REC'))['train'].get('apply_chat_template') else '')")
  for engine in hf vllm; do
    t "evalbase $engine"; s=$(date +%s)
    CUDA_VISIBLE_DEVICES=${EVAL_GPU:-0} python3 -m autorl.evaluate --model "$SMALL/model" --id "$SMALL/probe_id.jsonl" \
      --ood "$SMALL/probe_ood.jsonl" --metrics-out "$OUT/evalbase-$engine.jsonl" --max-new-tokens "$max_new" \
      --engine "$engine" $chat --no-special-tokens > "$OUT/evalbase-$engine.log" 2>&1
    echo "evalbase $engine exit $? in $(( $(date +%s) - s )) s"; tail -1 "$OUT/evalbase-$engine.log"
  done
}
phase_one() {
  t one; workspace /tmp/ws-one; g=$(sample_gpu one); s=$(date +%s)
  python3 -m autorl.cli -C /tmp/ws-one train recipes/small.yaml ${ONE_SET:+--set "$ONE_SET"} --json > "$OUT/one.json" 2> "$OUT/one.err"
  echo "one trial exit $? in $(( $(date +%s) - s )) s"; kill "$g"
  cp /tmp/ws-one/.autorl/train/*/train.log "$OUT/one-train.log" 2>/dev/null
  cp /tmp/ws-one/.autorl/train/*/train.log.times "$OUT/one-train.log.times" 2>/dev/null
  tail -c 600 "$OUT/one.json"
}
phase_sweep() {
  t sweep; g=$(sample_gpu sweep); s=$(date +%s)
  for lr in ${LRS:-1e-6 1e-5 1e-4 1e-3}; do
    workspace "/tmp/ws-lr$lr"
    python3 -m autorl.cli -C "/tmp/ws-lr$lr" train recipes/small.yaml --set "lr=$lr" --json > "$OUT/sweep-$lr.json" 2>&1 &
  done
  wait_for_trains; echo "sweep wall $(( $(date +%s) - s )) s"; kill "$g"
  for lr in ${LRS:-1e-6 1e-5 1e-4 1e-3}; do
    printf '%s ' "lr $lr"; python3 - "$OUT/sweep-$lr.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    out = json.loads(text[text.index("{"):])
except ValueError:
    print("no result:", text[-300:].replace("\n", " ")); sys.exit()
print(out.get("status"), out.get("exit_code"), out.get("final_eval"), out.get("wall_s"))
PY
  done
  tar -czf "$OUT/sweep-logs.tgz" /tmp/ws-lr*/.autorl/train/*/train.log* /tmp/ws-lr*/.autorl/train/*/*.jsonl 2>/dev/null
}
phase_oneb() {
  t oneb; workspace /tmp/ws-oneb
  setsid bash -c "s=\$(date +%s); python3 -m autorl.cli -C /tmp/ws-oneb train recipes/small.yaml ${ONE_SET:+--set $ONE_SET} \
    --json > $OUT/oneb.json 2> $OUT/oneb.err; echo \"exit \$? in \$(( \$(date +%s) - s )) s\" >> $OUT/oneb.json" \
    < /dev/null > /dev/null 2>&1 &
}
sample_studies() {  # every card once a second into /tmp/gpu-study.csv, in its own session (it outlives the call)
  pgrep -f "query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 1$" >/dev/null && return
  setsid bash -c "exec nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 1" \
    < /dev/null >> /tmp/gpu-study.csv 2>/dev/null &
}
gpu_busy() {  # per card: the share of samples with the GPU busy (utilisation above 0) and the mean utilisation
  python3 - "$1" <<'PY'
import collections, sys
cards = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 4 and parts[2].endswith("%"):
        cards[parts[1]].append(float(parts[2].rstrip(" %")))
for card, u in sorted(cards.items()):
    print(f"card {card}: busy {100 * sum(x > 0 for x in u) / len(u):.1f} % of {len(u)} samples, mean {sum(u) / len(u):.1f} %")
PY
}
wait_for_trains() { while pgrep -f "autorl.cli -C /tmp/ws-" >/dev/null; do sleep 2; done; }
sets() { for kv in ${SETS:-}; do printf -- '--set\n%s\n' "$kv"; done; }
phase_study() {
  t study; mapfile -t extra < <(sets)
  local gpus=(${GPUS:-}) i=0
  for seed in ${SEEDS:-0 1}; do
    workspace "/tmp/ws-study$seed"
    if [ ${#gpus[@]} -gt 0 ]; then export CUDA_VISIBLE_DEVICES=${gpus[$(( i % ${#gpus[@]} ))]}; fi; i=$(( i + 1 ))
    setsid python3 -m autorl.cli -C "/tmp/ws-study$seed" run recipes/small.yaml --budget "${BUDGET:-20m}" \
      --seed "$seed" --study "$MODEL-seed$seed" ${STUDY_PAR:+--parallel "$STUDY_PAR"} "${extra[@]}" \
      > "$OUT/study$seed.log" 2>&1 < /dev/null &
  done
  unset CUDA_VISIBLE_DEVICES
  sample_studies
  sleep 5; tail -n 2 "$OUT"/study*.log
}
phase_par() {
  local n=${PAR_NAME:-par}; t "par $n"; workspace "/tmp/ws-$n"; mapfile -t extra < <(sets)
  CUDA_VISIBLE_DEVICES=${PAR_GPUS:-0,1} setsid python3 -m autorl.cli -C "/tmp/ws-$n" run recipes/small.yaml \
    --budget "${BUDGET:-20m}" --parallel "${PAR:-2}" --seed "${PAR_SEED:-3}" --study "$n${PAR:-2}" "${extra[@]}" \
    > "$OUT/$n.log" 2>&1 < /dev/null &
  sample_studies; sleep 5; tail -n 2 "$OUT/$n.log"
}
phase_nodes() {  # a two-node Ray cluster on one host (a head given card NODES_GPUS[0], a second node card
  # NODES_GPUS[1]), and a --parallel NODES_PAR study of BUDGET through --ray-address, in the background
  t nodes; workspace /tmp/ws-nodes; mapfile -t extra < <(sets); local g=(${NODES_GPUS:-0 1})
  setsid python3 benchmarks/openrlhf_nodes.py "$OUT" /tmp/ws-nodes "${g[0]}" "${g[1]}" -- recipes/small.yaml \
    --budget "${BUDGET:-12m}" --parallel "${NODES_PAR:-2}" --seed "${PAR_SEED:-0}" --study nodes "${extra[@]}" \
    > "$OUT/nodes.log" 2>&1 < /dev/null &
  sample_studies; sleep 30; tail -n 3 "$OUT/nodes.log"
}
running_jobs() {  # how many of a workspace's trials are running with a Ray job
  python3 - "$1" <<'PY'
import sqlite3, sys
try:  # the ledger may not exist yet: the study is still preparing
    db = sqlite3.connect(f"file:{sys.argv[1]}/ledger.sqlite?mode=ro", uri=True)
    print(db.execute("SELECT count(*) FROM autorl_trials WHERE status = 'running' AND job_id IS NOT NULL").fetchone()[0])
except sqlite3.Error:
    print(0)
PY
}
head_group() {  # the processes of every private Ray head's group: its guard, `ray start`, GCS, raylet, dashboard
  ps -eo pid,pgid,etimes,args | grep -E "groupguard|/ray start --head|gcs_server|raylet|dashboard" | grep -v grep | cut -c1-140
}
gpu_apps() {  # GPU processes on the cards $1 (default: all), and the Ray heads on the host with the cards each was given
  echo "GPU processes${1:+ on cards $1}: $(nvidia-smi ${1:+-i "$1"} --query-compute-apps=pid,used_memory --format=csv,noheader | wc -l)"
  local heads=""; for p in $(pgrep -f "^[^ ]+ [^ ]*/ray start --head"); do  # `ray start` itself: not its guard, not a shell
    heads+="$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^CUDA_VISIBLE_DEVICES=//p' | head -1)|"; done
  echo "Ray heads on the host, by their cards: ${heads:-none}"
}
phase_split() {
  t split; workspace /tmp/ws-split
  CUDA_VISIBLE_DEVICES=${SPLIT_GPUS:-0,1} python3 -m autorl.cli -C /tmp/ws-split train recipes/small.yaml \
    --set colocate_all=false --set 'extra_args=["--vllm.enforce_eager"]' --dry-run > "$OUT/split-plan.txt" 2>&1
  s=$(date +%s)
  CUDA_VISIBLE_DEVICES=${SPLIT_GPUS:-0,1} python3 -m autorl.cli -C /tmp/ws-split train recipes/small.yaml \
    --set colocate_all=false --set 'extra_args=["--vllm.enforce_eager"]' --json > "$OUT/split.json" 2> "$OUT/split.err"
  echo "split trial exit $? in $(( $(date +%s) - s )) s"; tail -c 400 "$OUT/split.json"
  cp /tmp/ws-split/.autorl/train/*/train.log "$OUT/split-train.log" 2>/dev/null
  cp /tmp/ws-split/.autorl/train/*/train.log.times "$OUT/split-train.log.times" 2>/dev/null
}
phase_oom() {
  t oom; workspace /tmp/ws-oom
  CUDA_VISIBLE_DEVICES=${OOM_GPU:-0} python3 -c "import time, torch
free, _ = torch.cuda.mem_get_info(); x = torch.empty(int(free * 0.97), dtype=torch.uint8, device='cuda')
print('holding', round(x.numel() / 2**30, 1), 'GiB', flush=True); time.sleep(1200)" > "$OUT/oom-hog.log" 2>&1 &
  hog=$!; sleep 20; cat "$OUT/oom-hog.log"; gpu_apps
  CUDA_VISIBLE_DEVICES=${OOM_GPU:-0} python3 -m autorl.cli -C /tmp/ws-oom run recipes/small.yaml --budget 8m \
    --max-trials 2 --study oom > "$OUT/oom.log" 2>&1
  echo "oom study exit $?"; kill "$hog"; tail -n 12 "$OUT/oom.log"
  python3 -m autorl.cli -C /tmp/ws-oom triage > "$OUT/oom-triage.txt" 2>&1; head -20 "$OUT/oom-triage.txt"
}
phase_kill9() {  # K9_WS: kill -9 a `run --resume` of that workspace's study instead of a new one; K9_PARALLEL
  # trials at once (default 2), killed K9_AFTER s after that many run; K9_BG=1 resumes in the background (`wait`)
  local ws=${K9_WS:-/tmp/ws-kill9} par=${K9_PARALLEL:-2} gpus=${K9_GPUS:-0,1}; t "kill9 $ws"; mapfile -t extra < <(sets)
  if [ -z "${K9_WS:-}" ]; then
    workspace "$ws"
    CUDA_VISIBLE_DEVICES=$gpus setsid python3 -m autorl.cli -C "$ws" run recipes/small.yaml \
      --budget 20m --parallel "$par" --seed 5 --study kill9 "${extra[@]}" > "$OUT/kill9.log" 2>&1 < /dev/null &
  else
    CUDA_VISIBLE_DEVICES=$gpus setsid python3 -m autorl.cli -C "$ws" run --resume --budget "${K9_BUDGET:-20m}" \
      --parallel "$par" > "$OUT/kill9.log" 2>&1 < /dev/null &
  fi
  pid=$!; s=$SECONDS; sample_studies
  while [ "$(running_jobs "$ws")" -lt "$par" ] && [ $(( SECONDS - s )) -lt 400 ]; do sleep 2; done
  echo "$(running_jobs "$ws") jobs running after $(( SECONDS - s )) s"
  sleep "${K9_AFTER:-20}"; echo "jobs running: $(running_jobs "$ws")"; gpu_apps "$gpus"; head_group
  kill -9 "$pid"; sleep 20
  echo "after kill -9:"; gpu_apps "$gpus"; head_group; tail -n 5 "$OUT/kill9.log"
  [ "${K9_RESUME:-6m}" = none ] && return
  local cap=(); [ -z "${K9_WS:-}" ] && cap=(--max-trials 4)
  if [ -n "${K9_BG:-}" ]; then
    CUDA_VISIBLE_DEVICES=$gpus setsid python3 -m autorl.cli -C "$ws" run --resume --budget "${K9_RESUME:-6m}" \
      --parallel "$par" "${cap[@]}" > "$OUT/kill9-resume.log" 2>&1 < /dev/null &
    sleep 30; tail -n 8 "$OUT/kill9-resume.log"; return
  fi
  CUDA_VISIBLE_DEVICES=$gpus python3 -m autorl.cli -C "$ws" run --resume --budget "${K9_RESUME:-6m}" \
    --parallel "$par" "${cap[@]}" > "$OUT/kill9-resume.log" 2>&1
  echo "resume exit $?"; sleep 5; gpu_apps "$gpus"
  python3 -m autorl.cli -C "$ws" ledger > "$OUT/kill9-ledger.txt" 2>&1; tail -n 16 "$OUT/kill9-ledger.txt"
}
phase_promote() {  # `autorl promote` of a finished study's best confirmed trial (PROMOTE_WS, e.g. /tmp/ws-q0), in
  # its own session: fresh-seed re-runs, then the detached full run (PROMOTE_EPISODES); `status` once a minute
  local ws=${PROMOTE_WS:-/tmp/ws-q0}; t "promote $ws"
  CUDA_VISIBLE_DEVICES=${PROMOTE_GPU:-0} setsid python3 -m autorl.cli -C "$ws" promote --repeats "${PROMOTE_REPEATS:-2}" \
    --parallel "${PROMOTE_PARALLEL:-1}" ${PROMOTE_EPISODES:+--episodes "$PROMOTE_EPISODES"} ${PROMOTE_ARGS:-} > "$OUT/promote.log" 2>&1 < /dev/null &
  sample_studies
  for _ in $(seq "${PROMOTE_POLLS:-8}"); do sleep 60; python3 -m autorl.cli -C "$ws" status >> "$OUT/promote-status.txt" 2>&1; done
  tail -n 20 "$OUT/promote.log"; tail -n 20 "$OUT/promote-status.txt"
  find "$ws/.autorl" -path '*full*' \( -name '*.safetensors' -o -name '*.bin' \) -printf '%p %s\n' 2>/dev/null | head
}
phase_wait() {  # collect studies started by an earlier call (they run in their own sessions)
  t wait; while pgrep -f "autorl.cli -C /tmp/ws-[^ ]* run" >/dev/null && [ $(( SECONDS )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  for d in /tmp/ws-*; do
    [ -f "$d/ledger.sqlite" ] || continue; n=$(basename "$d")
    python3 -m autorl.cli -C "$d" ledger > "$OUT/$n-ledger.txt" 2>&1; tail -25 "$OUT/$n-ledger.txt"
    python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
      "$d/ledger.sqlite" "$OUT/$n-ledger.sqlite" 2>/dev/null  # with what its write-ahead log holds
    python3 benchmarks/openrlhf_phases.py "$d" > "$OUT/$n-phases.md" 2>&1; cat "$OUT/$n-phases.md"
  done
  cp /tmp/gpu-study.csv "$OUT/" 2>/dev/null && gpu_busy /tmp/gpu-study.csv | tee "$OUT/gpu-busy.txt"
  if [ -d /tmp/ws-oneb ]; then
    tail -c 700 "$OUT/oneb.json"; cp /tmp/ws-oneb/.autorl/train/*/train.log "$OUT/oneb-train.log" 2>/dev/null
    cp /tmp/ws-oneb/.autorl/train/*/train.log.times "$OUT/oneb-train.log.times" 2>/dev/null
  fi
  for d in /tmp/ws-*; do  # one trial's real logs, TensorBoard file and eval, for replay tests
    r=$(ls -d "$d"/.autorl/runs/attempt-03-* 2>/dev/null | head -1); [ -n "$r" ] || continue
    tar -czf "$OUT/$(basename "$d")-attempt03.tgz" -C "$r" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' . 2>/dev/null
  done
}
wait_for_line() {  # $1: a file, $2: an extended regex; waits up to $3 s (default 600) for a line to match
  local s=$SECONDS; while ! grep -a -q -E "$2" "$1" 2>/dev/null; do
    [ $(( SECONDS - s )) -lt "${3:-600}" ] || return 1; sleep 1; done
}
after_fault() {  # what a fault left: the study's exit, its crashes, and the GPU and Ray processes afterwards
  local ws=$1 name=$2; sleep 5
  python3 -m autorl.cli -C "$ws" ledger > "$OUT/$name-ledger.txt" 2>&1; tail -n 12 "$OUT/$name-ledger.txt"
  python3 -m autorl.cli -C "$ws" triage > "$OUT/$name-triage.txt" 2>&1; head -n 20 "$OUT/$name-triage.txt"
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$ws/ledger.sqlite" "$OUT/$name-ledger.sqlite" 2>/dev/null
  for r in "$ws"/.autorl/runs/attempt-*; do cp "$r/train.log" "$OUT/$name-$(basename "$r").log" 2>/dev/null; done
  gpu_apps; head_group
}
phase_vllmkill() {  # a trial's vLLM engine killed (SIGKILL) mid-rollout: the trial must end as a crash, triaged,
  # the study go on or stop as its rules say, and no GPU process or Ray head be left once it ends
  t vllmkill; workspace /tmp/ws-vk; mapfile -t extra < <(sets)
  setsid python3 -m autorl.cli -C /tmp/ws-vk run recipes/small.yaml --budget "${BUDGET:-8m}" --max-trials 2 \
    --study vllmkill "${extra[@]}" > "$OUT/vllmkill.log" 2>&1 < /dev/null &
  local pid=$!
  wait_for_line /tmp/ws-vk/.autorl/runs/attempt-01-baseline/train.log "Global step 2" || echo "no step 2 seen"
  local engines; engines=$(pgrep -f "EngineCore|RolloutRayActor" | tr '\n' ' ')
  echo "killing the vLLM engine processes: ${engines:-none found}"; [ -n "$engines" ] && kill -9 $engines
  wait "$pid"; echo "study exit $?"; after_fault /tmp/ws-vk vllmkill
}
phase_warmkill() {  # a warm pool's server killed (SIGKILL) between two trials: the next trial must not be lost:
  # it fails as the pool's loss or runs in a new pool, and the study's ledger says which
  t warmkill; workspace /tmp/ws-wk; mapfile -t extra < <(sets)
  setsid python3 -m autorl.cli -C /tmp/ws-wk run recipes/small.yaml --budget "${BUDGET:-10m}" --max-trials 3 \
    --set warm_pool=true --study warmkill "${extra[@]}" > "$OUT/warmkill.log" 2>&1 < /dev/null &
  local pid=$!
  wait_for_line /tmp/ws-wk/.autorl/runs/attempt-01-baseline/train.log "AUTORL-WARM attempt-01-baseline end" \
    || echo "no first trial end seen"
  local servers; servers=$(pgrep -f "[w]arm_server" | tr '\n' ' ')
  echo "killing the warm server processes: ${servers:-none found}"; [ -n "$servers" ] && kill -9 $servers
  wait "$pid"; echo "study exit $?"; after_fault /tmp/ws-wk warmkill
  grep -a -h "warm pool" /tmp/ws-wk/.autorl/runs/attempt-0*/train.log | head -5
}
for p in "${@:2}"; do "phase_$p"; done
t done
