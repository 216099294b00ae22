#!/usr/bin/env bash
# The OpenRLHF GPU proof: a 3-trial autorl study of real OpenRLHF 0.10.x Ray jobs with per-item evals, an
# early abort that stops a running Ray job, and a run 0.10.x rejects at start, classified by triage.
#   bash benchmarks/openrlhf_gpu_proof.sh OUTDIR PHASE...   (phases: study evals abort fail gputest; in an
#                                                            environment with openrlhf, ray, vllm, deepspeed, a GPU)
set -uo pipefail
OUT=${1:-/tmp/openrlhf-proof}; mkdir -p "$OUT"; WS=/tmp/autorl-ws; TINY=/tmp/autorl-openrlhf-tiny
cd "$(dirname "$0")/.." || exit 1  # run from the package root: a checkout beside it must not shadow it
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REC=$(python3 -c "import autorl.data as d; print(d.shipped('recipes/openrlhf-tiny.yaml'))")
t() { echo "== $(date +%T) $*"; }
python3 -m autorl.backends.openrlhf.tiny "$TINY" >/dev/null 2>&1 || { echo "tiny inputs failed"; exit 1; }
rm -rf "$WS"; python3 -m autorl.cli init "$WS" || exit 1
git -C "$WS" config user.email proof@example.invalid; git -C "$WS" config user.name proof
phase_study() {
  t study; s=$(date +%s)
  python3 -m autorl.cli -C "$WS" run "$REC" --strategy optuna --max-trials 3 --budget 14m --study tiny 2>&1 | tee "$OUT/study.log"
  echo "study wall $(( $(date +%s) - s )) s"
}
phase_evals() {  # the per-item evaluator on every trial's saved model (what eval_plan runs after training)
  t evals
  for m in "$WS"/.autorl/runs/*/model; do
    [ -f "$m/config.json" ] || continue; r=$(dirname "$m"); s=$(date +%s)
    python3 -m autorl.evaluate --model "$m" --id $TINY/probe_id.jsonl --ood $TINY/probe_ood.jsonl \
      --metrics-out "$r/eval.jsonl" --max-new-tokens 6 --k 4 --temperature 1.0 --engine hf --step 4 2>&1 | tail -1
    echo "eval $(basename "$r") $(( $(date +%s) - s )) s"
  done
}
phase_abort() {
  t abort; sed -e 's/max_samples: 32/max_samples: 128/' -e 's/abort: {window: 8}/abort: {window: 2}/' "$REC" > /tmp/abort.yaml
  python3 -m autorl.cli -C "$WS" run /tmp/abort.yaml --strategy random --max-trials 2 --budget 9m --study abort 2>&1 | tee "$OUT/abort.log"
  sleep 5; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$OUT/nvidia-smi-after-abort.txt"
  ps aux | grep -E "train_ppo_ray|VLLM|PPOTrainer|ActorModel" | grep -v grep | tee -a "$OUT/nvidia-smi-after-abort.txt"
}
phase_gputest() {
  t gputest; python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/openrlhf/test_gpu_study.py 2>&1 | tail -15 | tee "$OUT/gputest.log"
}
phase_fail() {
  t fail; sed -e 's/--vllm.enforce_eager\]/--vllm.enforce_eager, --packing_samples]/' "$REC" > /tmp/fail.yaml
  python3 -m autorl.cli -C "$WS" run /tmp/fail.yaml --strategy random --max-trials 1 --budget 5m --study fail 2>&1 | tee "$OUT/fail.log"
}
for p in "${@:2}"; do "phase_$p"; done
t collect
python3 -m autorl.cli -C "$WS" ledger --json > "$OUT/ledger.json" 2>&1
cp "$WS"/ledger.sqlite "$OUT/" 2>/dev/null
(cd "$WS/.autorl" && tar -czf "$OUT/runs.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' runs) 2>/dev/null
ls -la "$OUT"
