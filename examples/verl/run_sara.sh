#!/usr/bin/env bash
# One verl 0.9.1 GRPO run with rlvr-alloc's SARA allocator choosing the rollouts (examples/verl/README.md).
# NOT RUN in this repository: it needs a CUDA GPU, vLLM (verl[vllm]) and a model; what runs on CPU is listed in
# docs/verl.md. Data: verl's GSM8K preprocessing (python -m verl.examples.data_preprocess.gsm8k or the script in
# verl's repository) writes ~/data/gsm8k/{train,test}.parquet.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
mapfile -t ALLOC < <(grep -v '^\s*#' examples/verl/allocator_overrides.txt | grep -v '^\s*$')
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  data.train_batch_size=32 data.max_prompt_length=512 data.max_response_length=512 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.logger='["console"]' \
  trainer.total_training_steps=${STEPS:-20} trainer.save_freq=10 trainer.test_freq=-1 \
  trainer.default_local_dir=${OUT:-checkpoints/verl_sara} \
  "${ALLOC[@]}" "$@"
