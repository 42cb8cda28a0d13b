#!/usr/bin/env bash
# GPU smoke test of the scaling presets: run it on a CUDA machine after `make install`:
#   bash scripts/gpu_smoke.sh
# Each case is a short real training run (the CNN on the offline mnist5k digits, 3 epochs) that must end
# with test accuracy >= MIN_ACC; one PASS/FAIL line per case, exit status 1 if any failed. About 3 minutes
# on one GPU. Runs write to a temporary folder (printed at the end), never to logs/.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
MIN_ACC=${MIN_ACC:-0.85}
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())") || exit 1
if [ "$GPUS" -lt 1 ]; then
  echo "FAIL  no CUDA GPU is visible (torch.cuda.device_count() = 0): run this on a GPU machine"
  exit 1
fi
LOGS=$(mktemp -d -t gpu_smoke.XXXXXX)
BATCH=$(( 64 / GPUS * GPUS ))  # the global batch must split evenly across the GPUs
COMMON=(trainer.max_epochs=3 "data.batch_size=$BATCH" "paths.log_dir=$LOGS" extras.print_config=false)
FAILED=0

# run_case NAME SCRIPT OVERRIDES...: run `python src/SCRIPT.py`, then check its exit status and test/acc.
run_case() {
  local name=$1 script=$2 start output acc
  shift 2
  start=$(date +%s)
  output="$LOGS/$name.out"
  if timeout 600 "$PY" "src/$script.py" "${COMMON[@]}" "hydra.run.dir=$LOGS/$name" "$@" >"$output" 2>&1; then
    acc=$(grep -o "test/acc=[0-9.]*" "$output" | tail -n 1 | cut -d= -f2)
    if [ -n "$acc" ] && "$PY" -c "import sys; sys.exit(float('$acc') < $MIN_ACC)"; then
      echo "PASS  $name  test/acc=$acc  $(( $(date +%s) - start )) s"
      return
    fi
    echo "FAIL  $name  test/acc=${acc:-missing} (< $MIN_ACC)  $(( $(date +%s) - start )) s  log: $output"
  else
    echo "FAIL  $name  exit status $?  $(( $(date +%s) - start )) s  log: $output"
    tail -n 5 "$output" | sed 's/^/      /'
  fi
  FAILED=1
}

echo "gpu_smoke: $GPUS GPU(s): $("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")"
run_case bf16-mixed train trainer=gpu trainer.precision=bf16-mixed
run_case 16-mixed train trainer=gpu trainer.precision=16-mixed
run_case auto train trainer=gpu trainer.precision=auto  # its log says bf16-mixed (Ampere or newer) or 32, and why
grep -h "trainer.precision=auto" "$LOGS/auto.out" | sed 's/^.*\] - /      /'
run_case "ddp-$GPUS-gpus" train trainer=ddp "trainer.devices=$GPUS"
run_case "fsdp-$GPUS-gpus" train trainer=fsdp "trainer.devices=$GPUS" trainer.precision=bf16-mixed
# FSDP's checkpoint (state_dict_type=full) is one file: a plain one-GPU eval must load it.
run_case fsdp-checkpoint-eval eval trainer=gpu "ckpt_path=$LOGS/fsdp-$GPUS-gpus/checkpoints/best.ckpt"
run_case compile train trainer=gpu model.compile=true
if "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  run_case "deepspeed-$GPUS-gpus" train trainer=deepspeed "trainer.devices=$GPUS" trainer.precision=bf16-mixed
else
  echo "SKIP  deepspeed  (not installed: pip install -e '.[deepspeed]')"
fi
echo "gpu_smoke: logs in $LOGS"
exit $FAILED
