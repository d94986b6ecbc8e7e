"""The answers of GET /v1/checks/{id} that Swagger shows: real finished checks, written by
`python -m tests.support.finished_checks` (do not edit by hand).

Over 300 lines: data, three servers' answers whole.
"""

# ruff: noqa: E501  (the server's sentences, as it wrote them)

from __future__ import annotations

import json
from typing import Any

FINISHED_CHECKS: dict[str, dict[str, Any]] = json.loads(
    r"""{
 "resume": {
  "summary": "A finished check: Lose half the replicas mid-run: checkpoint after 7 steps on 4, resume on 2",
  "description": "The answer of a real check of the POST /v1/checks example of the same name, run on two warm CPU ranks; long curves cut to their first and last points.",
  "value": {
   "id": "7d3e9a1c5b2f4e8a9c0d6b1e3f5a7c2d",
   "status": "succeeded",
   "created_at": "2026-12-06T12:00:00.000000+00:00",
   "started_at": "2026-12-06T12:00:00.050000+00:00",
   "finished_at": "2026-12-06T12:00:02.000000+00:00",
   "result": {
    "model": "synthetic",
    "ddp_equivalence": {
     "equivalent": true,
     "fails_with_ddp_defaults": false,
     "summary": "DDP-equivalent at this split: the DDP step's gradient equals the single-process gradient",
     "findings": []
    },
    "backend": "gloo",
    "device": "cpu",
    "device_name": "cpu",
    "dtype": "float64",
    "nnodes": 1,
    "processes": 2,
    "data_parallel_size": 4,
    "replicas_per_process": 2,
    "global_batch_size": 32,
    "micro_batch_sizes": [
     4
    ],
    "gradient_accumulation_steps": 2,
    "split": "even",
    "max_abs_diff": 5.551115123125783e-17,
    "rel_l2": 1.4043515890879923e-16,
    "tolerance": 1e-10,
    "controls": [
     {
      "name": "accumulation_not_divided",
      "description": "the plan's loss scale without dividing by the gradient accumulation steps",
      "rel_l2": 1.0,
      "max_abs_diff": 0.5436945666352138,
      "detected": true
     },
     {
      "name": "sum_without_scaling",
      "description": "sum-reduced losses with no loss scale",
      "rel_l2": 7.0,
      "max_abs_diff": 3.8058619664464963,
      "detected": true
     },
     {
      "name": "no_distributed_sampler",
      "description": "no DistributedSampler: every replica reads the same samples",
      "rel_l2": 1.0195045541578727,
      "max_abs_diff": 0.6061887824482894,
      "detected": true
     },
     {
      "name": "set_epoch_missing",
      "description": "sampler.set_epoch(epoch) never called: every epoch reads the first epoch's order",
      "rel_l2": 0.11700268323402424,
      "max_abs_diff": 0.10095050519500781,
      "detected": true
     },
     {
      "name": "resume_without_skip",
      "description": "the resumed ranks call set_epoch(epoch) but skip nothing: the epoch's data starts again from its first step",
      "rel_l2": 0.1882702382698905,
      "max_abs_diff": 0.22685474950232803,
      "detected": true
     },
     {
      "name": "resume_keeps_micro_batch",
      "description": "the resumed replicas keep the old micro-batch and accumulation (and loss scale): the global batch shrinks or grows with the replicas",
      "rel_l2": 0.21475961354847134,
      "max_abs_diff": 0.2204574161103593,
      "detected": true
     },
     {
      "name": "resume_per_rank_position",
      "description": "each new rank restores the position the old rank of its number had in its own shard (per-rank loader states): it skips the old shard's count of samples in its new shard",
      "rel_l2": 0.1538865235553148,
      "max_abs_diff": 0.12929464701069787,
      "detected": true
     }
    ],
    "controls_skipped": [
     {
      "name": "unweighted_mean",
      "reason": "every replica has the same micro-batch, so a plain mean is already right"
     },
     {
      "name": "whole_global_batch",
      "reason": "with mean-reduced losses at the plan's scales, replicas that each read the whole global batch average to the right gradient: the mistake costs compute, not correctness"
     },
     {
      "name": "scheduler_per_micro_batch",
      "reason": "the schedule gives the same lr at every step the mistake reaches over these 20 steps"
     },
     {
      "name": "scheduler_per_process",
      "reason": "the schedule gives the same lr at every step the mistake reaches over these 20 steps"
     },
     {
      "name": "clip_before_all_reduce",
      "reason": "the recipe does not clip (no learning_rate.max_grad_norm)"
     },
     {
      "name": "resume_schedule_restart",
      "reason": "the schedule gives the same lr from step 7 to 19 as from step 0 on: restarting it changes nothing"
     }
    ],
    "sampler_checked": true,
    "noise_scale": null,
    "micro_batch_search": null,
    "timings_s": {
     "model": 0.001692,
     "ddp": 0.011609,
     "data": 0.001834,
     "step": 0.008042,
     "controls": 0.006844,
     "reference": 0.002241,
     "run_reference": 0.097537,
     "run": 0.266153,
     "rank_total": 0.396612,
     "init_process_group": 0.036989,
     "check": 0.478389,
     "queued": 0.003683,
     "end_to_end": 0.482071
    },
    "torch_version": "2.13.0+cpu",
    "mesh": null,
    "wrapper": "ddp",
    "node_rank": 0,
    "workload": "synthetic",
    "warnings": [],
    "steps": 20,
    "trajectory": [
     {
      "step": 0,
      "epoch": 0,
      "lr": 0.1,
      "loss": 2.4016150059844956,
      "reference_loss": 2.4016150059844956,
      "params_rel_l2": 1.7930157712184807e-17,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 1,
      "epoch": 0,
      "lr": 0.1,
      "loss": 1.7490450606731787,
      "reference_loss": 1.7490450606731787,
      "params_rel_l2": 3.537936783749786e-17,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 2,
      "epoch": 0,
      "lr": 0.1,
      "loss": 1.4315584440585916,
      "reference_loss": 1.4315584440585911,
      "params_rel_l2": 4.666886271565517e-17,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 3,
      "epoch": 0,
      "lr": 0.1,
      "loss": 1.253658496036857,
      "reference_loss": 1.2536584960368569,
      "params_rel_l2": 5.934506238686163e-17,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 4,
      "epoch": 0,
      "lr": 0.1,
      "loss": 1.091033406270879,
      "reference_loss": 1.091033406270879,
      "params_rel_l2": 7.866850779487941e-17,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 15,
      "epoch": 1,
      "lr": 0.1,
      "loss": 1.0599986044350143,
      "reference_loss": 1.059998604435014,
      "params_rel_l2": 2.2102918794234065e-16,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 16,
      "epoch": 1,
      "lr": 0.1,
      "loss": 1.1546326360954482,
      "reference_loss": 1.154632636095448,
      "params_rel_l2": 2.3228092163957884e-16,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 17,
      "epoch": 1,
      "lr": 0.1,
      "loss": 1.1153932284256993,
      "reference_loss": 1.1153932284256993,
      "params_rel_l2": 2.454183868309103e-16,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 18,
      "epoch": 1,
      "lr": 0.1,
      "loss": 1.1514691260112055,
      "reference_loss": 1.1514691260112055,
      "params_rel_l2": 2.541943623535082e-16,
      "valid_tokens": null,
      "within_tolerance": true
     },
     {
      "step": 19,
      "epoch": 1,
      "lr": 0.1,
      "loss": 1.1187875699952587,
      "reference_loss": 1.1187875699952587,
      "params_rel_l2": 2.5938950208907925e-16,
      "valid_tokens": null,
      "within_tolerance": true
     }
    ],
    "run_tolerance": 1e-12,
    "epoch_end": {
     "optimizer_steps_per_epoch": 10,
     "epochs_run": 2,
     "leftover": "dropped",
     "leftover_micro_steps": 0,
     "short_micro_batch_samples": null
    },
    "control_trajectories": {
     "set_epoch_missing": [
      {
       "step": 0,
       "lr": 0.1,
       "loss": 2.4016150059844956,
       "params_rel_l2": 0.0
      },
      {
       "step": 1,
       "lr": 0.1,
       "loss": 1.7490450606731787,
       "params_rel_l2": 0.0
      },
      {
       "step": 2,
       "lr": 0.1,
       "loss": 1.4315584440585911,
       "params_rel_l2": 0.0
      },
      {
       "step": 3,
       "lr": 0.1,
       "loss": 1.2536584960368569,
       "params_rel_l2": 0.0
      },
      {
       "step": 4,
       "lr": 0.1,
       "loss": 1.091033406270879,
       "params_rel_l2": 0.0
      },
      {
       "step": 15,
       "lr": 0.1,
       "loss": 1.1373777388976902,
       "params_rel_l2": 0.10973974544481765
      },
      {
       "step": 16,
       "lr": 0.1,
       "loss": 1.3019224186972376,
       "params_rel_l2": 0.11301487451946357
      },
      {
       "step": 17,
       "lr": 0.1,
       "loss": 1.1976935169219014,
       "params_rel_l2": 0.11151337258188919
      },
      {
       "step": 18,
       "lr": 0.1,
       "loss": 1.2098397388890305,
       "params_rel_l2": 0.11205487993625532
      },
      {
       "step": 19,
       "lr": 0.1,
       "loss": 0.9847687488811838,
       "params_rel_l2": 0.11700268323402424
      }
     ],
     "resume_without_skip": [
      {
       "step": 7,
       "lr": 0.1,
       "loss": 1.3316311801858949,
       "params_rel_l2": 0.0242419738540646
      },
      {
       "step": 8,
       "lr": 0.1,
       "loss": 1.3682443425298887,
       "params_rel_l2": 0.051737907393754126
      },
      {
       "step": 9,
       "lr": 0.1,
       "loss": 1.247992338922884,
       "params_rel_l2": 0.0820701025414034
      },
      {
       "step": 10,
       "lr": 0.1,
       "loss": 1.1491439705954478,
       "params_rel_l2": 0.10924860656456518
      },
      {
       "step": 11,
       "lr": 0.1,
       "loss": 0.9467260025627673,
       "params_rel_l2": 0.13338903770203459
      },
      {
       "step": 15,
       "lr": 0.1,
       "loss": 1.2988250427803463,
       "params_rel_l2": 0.1660058217165407
      },
      {
       "step": 16,
       "lr": 0.1,
       "loss": 1.1072354903610484,
       "params_rel_l2": 0.16234145615700216
      },
      {
       "step": 17,
       "lr": 0.1,
       "loss": 1.3621237867861558,
       "params_rel_l2": 0.16527653754996108
      },
      {
       "step": 18,
       "lr": 0.1,
       "loss": 1.0964947376874659,
       "params_rel_l2": 0.17246942626163161
      },
      {
       "step": 19,
       "lr": 0.1,
       "loss": 1.1627508968061089,
       "params_rel_l2": 0.1882702382698905
      }
     ],
     "resume_keeps_micro_batch": [
      {
       "step": 7,
       "lr": 0.1,
       "loss": 1.5213159821741762,
       "params_rel_l2": 0.016952712483856616
      },
      {
       "step": 8,
       "lr": 0.1,
       "loss": 1.589512214730841,
       "params_rel_l2": 0.029939226692747425
      },
      {
       "step": 9,
       "lr": 0.1,
       "loss": 1.16965905313721,
       "params_rel_l2": 0.03989663998117508
      },
      {
       "step": 10,
       "lr": 0.1,
       "loss": 1.2529985514648914,
       "params_rel_l2": 0.04934504976275306
      },
      {
       "step": 11,
       "lr": 0.1,
       "loss": 1.5576272447750679,
       "params_rel_l2": 0.06226517830624173
      },
      {
       "step": 15,
       "lr": 0.1,
       "loss": 1.270664320269346,
       "params_rel_l2": 0.10604941241116335
      },
      {
       "step": 16,
       "lr": 0.1,
       "loss": 1.0246240527073387,
       "params_rel_l2": 0.12289034888073445
      },
      {
       "step": 17,
       "lr": 0.1,
       "loss": 1.2582173935993517,
       "params_rel_l2": 0.14956863462676792
      },
      {
       "step": 18,
       "lr": 0.1,
       "loss": 1.1347941551627587,
       "params_rel_l2": 0.18568211093642362
      },
      {
       "step": 19,
       "lr": 0.1,
       "loss": 1.1739786232273146,
       "params_rel_l2": 0.21475961354847134
      }
     ],
     "resume_per_rank_position": [
      {
       "step": 7,
       "lr": 0.1,
       "loss": 1.1919176118724308,
       "params_rel_l2": 0.024058694362434685
      },
      {
       "step": 8,
       "lr": 0.1,
       "loss": 0.9994942442222554,
       "params_rel_l2": 0.04787115728336691
      },
      {
       "step": 9,
       "lr": 0.1,
       "loss": 1.3140232171387785,
       "params_rel_l2": 0.07568538462068918
      },
      {
       "step": 10,
       "lr": 0.1,
       "loss": 1.4791440272309728,
       "params_rel_l2": 0.1010676022118199
      },
      {
       "step": 11,
       "lr": 0.1,
       "loss": 1.3083064785457803,
       "params_rel_l2": 0.12074517708546187
      },
      {
       "step": 15,
       "lr": 0.1,
       "loss": 1.2457090422856905,
       "params_rel_l2": 0.1188761321865502
      },
      {
       "step": 16,
       "lr": 0.1,
       "loss": 1.1823102934710348,
       "params_rel_l2": 0.12312399412405516
      },
      {
       "step": 17,
       "lr": 0.1,
       "loss": 1.2095932089636388,
       "params_rel_l2": 0.13091786904526154
      },
      {
       "step": 18,
       "lr": 0.1,
       "loss": 0.9285007819302549,
       "params_rel_l2": 0.14248828995693819
      },
      {
       "step": 19,
       "lr": 0.1,
       "loss": 1.1268007963683289,
       "params_rel_l2": 0.1538865235553148
      }
     ]
    },
    "final_params_rel_l2": 2.5938950208907925e-16,
    "trajectory_matches": true,
    "resume": {
     "at_step": 7,
     "epoch": 0,
     "step_in_epoch": 7,
     "data_parallel_size_before": 4,
     "data_parallel_size_after": 2,
     "micro_batch_size": 4,
     "gradient_accumulation_steps": 4,
     "replica_groups": [
      {
       "start": 0,
       "stop": 2,
       "micro_batch_size": 4,
       "skip_micro_batches": 28,
       "skip_samples": 112
      }
     ],
     "checkpoint": "rank 0's model and optimizer state_dict (torch.save), loaded by every resumed rank",
     "matches": true
    },
    "throughput": null,
    "lr_scaling": null,
    "passed": true,
    "gradient_matches": true,
    "controls_detected": true,
    "controls_not_applicable": [
     "unweighted_mean",
     "whole_global_batch",
     "scheduler_per_micro_batch",
     "scheduler_per_process",
     "clip_before_all_reduce",
     "resume_schedule_restart"
    ]
   },
   "error": null,
   "request": {
    "plan": {
     "topology": {
      "num_nodes": 1,
      "gpus_per_node": 4,
      "throughput_curve": null,
      "node_groups": null
     },
     "global_batch_size": 32,
     "micro_batch_size": 4,
     "gradient_accumulation_steps": null,
     "max_micro_batch_size": null,
     "divisibility": "exact",
     "parallelism": {
      "tensor": 1,
      "pipeline": 1,
      "context": 1,
      "data_parallel_shard": 1,
      "expert": 1
     },
     "loss_reduction": "mean",
     "dataset": {
      "kind": "map",
      "num_samples": 320,
      "shuffle": true,
      "seed": 0,
      "drop_last": false,
      "epochs": null,
      "num_shards": null,
      "shard_samples": null,
      "splitter": null,
      "num_workers": null,
      "end_of_epoch": null
     },
     "learning_rate": null,
     "gradient_noise_scale": null,
     "gradient_noise_scale_stderr": null,
     "sequence_length": null,
     "global_batch_tokens": null,
     "micro_batch_tokens": null,
     "loss_normalization": "sample",
     "packing": null,
     "resume": null,
     "recommend": null
    },
    "model": "synthetic",
    "noise_scale": null,
    "fit_micro_batch": null,
    "backend": "auto",
    "dtype": "float64",
    "seed": 0,
    "timeout_s": null,
    "rendezvous": null,
    "workload": "synthetic",
    "steps": 20,
    "resume": {
     "at_step": 7,
     "data_parallel_size": 2
    },
    "throughput": null,
    "lr_scaling": null
   }
  }
 },
 "throughput": {
  "summary": "A finished check: Measure the throughput curve: samples/s of one replica at 8 micro-batch sizes",
  "description": "The answer of a real check of the POST /v1/checks example of the same name, run on two warm CPU ranks; long curves cut to their first and last points.",
  "value": {
   "id": "2b8f4d6a0c1e3a5b7d9f1c3e5a7b9d0f",
   "status": "succeeded",
   "created_at": "2026-12-06T12:00:00.000000+00:00",
   "started_at": "2026-12-06T12:00:00.050000+00:00",
   "finished_at": "2026-12-06T12:00:02.000000+00:00",
   "result": {
    "model": "synthetic",
    "ddp_equivalence": {
     "equivalent": true,
     "fails_with_ddp_defaults": false,
     "summary": "DDP-equivalent at this split: the DDP step's gradient equals the single-process gradient",
     "findings": []
    },
    "backend": "gloo",
    "device": "cpu",
    "device_name": "cpu",
    "dtype": "float64",
    "nnodes": 1,
    "processes": 2,
    "data_parallel_size": 2,
    "replicas_per_process": 1,
    "global_batch_size": 64,
    "micro_batch_sizes": [
     32
    ],
    "gradient_accumulation_steps": 1,
    "split": "even",
    "max_abs_diff": 1.1102230246251565e-16,
    "rel_l2": 2.011214428932966e-16,
    "tolerance": 1e-10,
    "controls": [
     {
      "name": "sum_without_scaling",
      "description": "sum-reduced losses with no loss scale",
      "rel_l2": 31.000000000000004,
      "max_abs_diff": 18.31935884982694,
      "detected": true
     },
     {
      "name": "no_distributed_sampler",
      "description": "no DistributedSampler: every replica reads the same samples",
      "rel_l2": 0.4543555233378761,
      "max_abs_diff": 0.18470523298717068,
      "detected": true
     }
    ],
    "controls_skipped": [
     {
      "name": "unweighted_mean",
      "reason": "every replica has the same micro-batch, so a plain mean is already right"
     },
     {
      "name": "accumulation_not_divided",
      "reason": "gradient_accumulation_steps is 1, so there is nothing to divide by"
     },
     {
      "name": "whole_global_batch",
      "reason": "with mean-reduced losses at the plan's scales, replicas that each read the whole global batch average to the right gradient: the mistake costs compute, not correctness"
     }
    ],
    "sampler_checked": true,
    "noise_scale": null,
    "micro_batch_search": null,
    "timings_s": {
     "model": 0.001304,
     "ddp": 0.026522,
     "data": 0.000671,
     "step": 0.002404,
     "controls": 0.003943,
     "reference": 0.002487,
     "throughput": 0.787348,
     "rank_total": 0.824737,
     "init_process_group": 0.0,
     "check": 0.828656,
     "queued": 0.001249,
     "end_to_end": 0.829905
    },
    "torch_version": "2.13.0+cpu",
    "mesh": null,
    "wrapper": "ddp",
    "node_rank": 0,
    "workload": "synthetic",
    "warnings": [],
    "steps": 1,
    "trajectory": null,
    "run_tolerance": null,
    "epoch_end": null,
    "control_trajectories": null,
    "final_params_rel_l2": null,
    "trajectory_matches": null,
    "resume": null,
    "throughput": {
     "points": [
      {
       "micro_batch_size": 1,
       "step_time_s": 0.000481455,
       "spread": 0.045767,
       "samples_per_s": 2077.04,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 18,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 2,
       "step_time_s": 0.000495643,
       "spread": 0.0151398,
       "samples_per_s": 4035.17,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 20,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 4,
       "step_time_s": 0.000496548,
       "spread": 0.0252647,
       "samples_per_s": 8055.61,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 20,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 8,
       "step_time_s": 0.000503997,
       "spread": 0.0347479,
       "samples_per_s": 15873.1,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 18,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 16,
       "step_time_s": 0.000508859,
       "spread": 0.0394444,
       "samples_per_s": 31442.9,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 20,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 32,
       "step_time_s": 0.000523531,
       "spread": 0.0263054,
       "samples_per_s": 61123.5,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 19,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 64,
       "step_time_s": 0.000531753,
       "spread": 0.0148128,
       "samples_per_s": 120357.0,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 16,
       "repeats": 10,
       "noisy": false
      },
      {
       "micro_batch_size": 128,
       "step_time_s": 0.00055373,
       "spread": 0.0450021,
       "samples_per_s": 231160.0,
       "tokens_per_s": null,
       "peak_memory_bytes": null,
       "micro_steps_per_repeat": 14,
       "repeats": 10,
       "noisy": false
      }
     ],
     "margin": 0.05,
     "repeats": 10,
     "warmup_steps": 3,
     "time_optimizer_step": false,
     "spread_is": "interquartile range / median of the repeats' step times",
     "device": "cpu",
     "threads": 1,
     "measured_by": "rank 0 alone, after the check (the other ranks idle)",
     "out_of_memory_at": null,
     "seconds": 0.787,
     "spread_bound": 0.05,
     "warnings": [],
     "fastest_micro_batch_size": 128,
     "knee_micro_batch_size": 128,
     "curve": [
      {
       "micro_batch_size": 1,
       "samples_per_s": 2077.04
      },
      {
       "micro_batch_size": 2,
       "samples_per_s": 4035.17
      },
      {
       "micro_batch_size": 4,
       "samples_per_s": 8055.61
      },
      {
       "micro_batch_size": 8,
       "samples_per_s": 15873.1
      },
      {
       "micro_batch_size": 16,
       "samples_per_s": 31442.9
      },
      {
       "micro_batch_size": 32,
       "samples_per_s": 61123.5
      },
      {
       "micro_batch_size": 64,
       "samples_per_s": 120357.0
      },
      {
       "micro_batch_size": 128,
       "samples_per_s": 231160.0
      }
     ]
    },
    "lr_scaling": null,
    "passed": true,
    "gradient_matches": true,
    "controls_detected": true,
    "controls_not_applicable": [
     "unweighted_mean",
     "accumulation_not_divided",
     "whole_global_batch"
    ]
   },
   "error": null,
   "request": {
    "plan": {
     "topology": {
      "num_nodes": 1,
      "gpus_per_node": 2,
      "throughput_curve": null,
      "node_groups": null
     },
     "global_batch_size": 64,
     "micro_batch_size": null,
     "gradient_accumulation_steps": null,
     "max_micro_batch_size": 128,
     "divisibility": "exact",
     "parallelism": {
      "tensor": 1,
      "pipeline": 1,
      "context": 1,
      "data_parallel_shard": 1,
      "expert": 1
     },
     "loss_reduction": "mean",
     "dataset": null,
     "learning_rate": null,
     "gradient_noise_scale": null,
     "gradient_noise_scale_stderr": null,
     "sequence_length": null,
     "global_batch_tokens": null,
     "micro_batch_tokens": null,
     "loss_normalization": "sample",
     "packing": null,
     "resume": null,
     "recommend": null
    },
    "model": "synthetic",
    "noise_scale": null,
    "fit_micro_batch": null,
    "backend": "auto",
    "dtype": "float64",
    "seed": 0,
    "timeout_s": null,
    "rendezvous": null,
    "workload": "synthetic",
    "steps": 1,
    "resume": null,
    "throughput": {
     "micro_batch_sizes": [
      1,
      2,
      4,
      8,
      16,
      32,
      64,
      128
     ],
     "repeats": 10,
     "warmup_steps": 3,
     "time_optimizer_step": false,
     "margin": 0.05
    },
    "lr_scaling": null
   }
  }
 },
 "lr_scaling": {
  "summary": "A finished check: Does the plan's sqrt rule train as well as the base batch? An lr-scaling probe",
  "description": "The answer of a real check of the POST /v1/checks example of the same name, run on two warm CPU ranks; long curves cut to their first and last points.",
  "value": {
   "id": "9e1c3a5b7d0f2e4c6a8b0d2f4e6a8c1b",
   "status": "succeeded",
   "created_at": "2026-12-06T12:00:00.000000+00:00",
   "started_at": "2026-12-06T12:00:00.050000+00:00",
   "finished_at": "2026-12-06T12:00:02.000000+00:00",
   "result": {
    "model": "synthetic",
    "ddp_equivalence": {
     "equivalent": true,
     "fails_with_ddp_defaults": false,
     "summary": "DDP-equivalent at this split: the DDP step's gradient equals the single-process gradient",
     "findings": [
      {
       "cause": "rank_dependent_untested",
       "modules": [],
       "detail": "one process ran every replica, so layers that depend on the rank could not show",
       "fix": "run the check with two or more processes",
       "breaks_equivalence": false,
       "fails_with_ddp_defaults": false
      }
     ]
    },
    "backend": "gloo",
    "device": "cpu",
    "device_name": "cpu",
    "dtype": "float64",
    "nnodes": 1,
    "processes": 1,
    "data_parallel_size": 2,
    "replicas_per_process": 2,
    "global_batch_size": 256,
    "micro_batch_sizes": [
     128
    ],
    "gradient_accumulation_steps": 1,
    "split": "even",
    "max_abs_diff": 4.996003610813204e-16,
    "rel_l2": 4.49921049652461e-16,
    "tolerance": 1e-10,
    "controls": [
     {
      "name": "sum_without_scaling",
      "description": "sum-reduced losses with no loss scale",
      "rel_l2": 127.00000000000001,
      "max_abs_diff": 75.67136885071466,
      "detected": true
     },
     {
      "name": "no_distributed_sampler",
      "description": "no DistributedSampler: every replica reads the same samples",
      "rel_l2": 0.2790512405678119,
      "max_abs_diff": 0.1725885595366521,
      "detected": true
     }
    ],
    "controls_skipped": [
     {
      "name": "unweighted_mean",
      "reason": "every replica has the same micro-batch, so a plain mean is already right"
     },
     {
      "name": "accumulation_not_divided",
      "reason": "gradient_accumulation_steps is 1, so there is nothing to divide by"
     },
     {
      "name": "whole_global_batch",
      "reason": "with mean-reduced losses at the plan's scales, replicas that each read the whole global batch average to the right gradient: the mistake costs compute, not correctness"
     }
    ],
    "sampler_checked": true,
    "noise_scale": null,
    "micro_batch_search": null,
    "timings_s": {
     "model": 0.002019,
     "ddp": 0.010947,
     "data": 0.000761,
     "step": 0.004175,
     "controls": 0.004862,
     "reference": 0.003097,
     "lr_scaling": 1.258137,
     "rank_total": 1.285206,
     "init_process_group": 0.00152,
     "check": 1.30798,
     "queued": 0.002608,
     "end_to_end": 1.310588
    },
    "torch_version": "2.13.0+cpu",
    "mesh": null,
    "wrapper": "ddp",
    "node_rank": 0,
    "workload": "synthetic",
    "warnings": [],
    "steps": 1,
    "trajectory": null,
    "run_tolerance": null,
    "epoch_end": null,
    "control_trajectories": null,
    "final_params_rel_l2": null,
    "trajectory_matches": null,
    "resume": null,
    "throughput": null,
    "lr_scaling": {
     "samples": 16384,
     "global_batch_size": 256,
     "length": "samples",
     "tolerance": 0.05,
     "tolerance_unit": "relative",
     "seeds": 3,
     "label_noise": 0.0,
     "base": {
      "batch_size": 32,
      "lr": 0.005,
      "curve": [
       {
        "samples": 0,
        "loss": 1.508677931362982
       },
       {
        "samples": 2048,
        "loss": 0.07486919975231623
       },
       {
        "samples": 4096,
        "loss": 0.036334417238660946
       },
       {
        "samples": 6144,
        "loss": 0.03328183649209167
       },
       {
        "samples": 8192,
        "loss": 0.0322202304740677
       },
       {
        "samples": 10240,
        "loss": 0.03109396492245426
       },
       {
        "samples": 12288,
        "loss": 0.0299398895177093
       },
       {
        "samples": 14336,
        "loss": 0.029319947685774065
       },
       {
        "samples": 16384,
        "loss": 0.028630814187545397
       }
      ],
      "last_interval_fall": 0.023503912954218307,
      "final_losses": [
       0.028630814187545397,
       0.03569192639773519,
       0.036859860560332594
      ]
     },
     "rules": [
      {
       "rule": "none",
       "lr": 0.005,
       "curve": [
        {
         "samples": 0,
         "loss": 1.508677931362982
        },
        {
         "samples": 2048,
         "loss": 1.1039212921519486
        },
        {
         "samples": 4096,
         "loss": 0.6230131119350073
        },
        {
         "samples": 6144,
         "loss": 0.3733870383127812
        },
        {
         "samples": 8192,
         "loss": 0.2595770408116986
        },
        {
         "samples": 10240,
         "loss": 0.193021740565363
        },
        {
         "samples": 12288,
         "loss": 0.146191307957151
        },
        {
         "samples": 14336,
         "loss": 0.11387549153117041
        },
        {
         "samples": 16384,
         "loss": 0.0917355033622458
        }
       ],
       "final_loss_ratio": 3.0290408943484763,
       "holds": false,
       "last_interval_fall": 0.19442276710493384,
       "still_falling": true,
       "seed_ratios": [
        3.2040829422919934,
        2.5031966209795793,
        3.3798431197738563
       ],
       "ratio_spread": 0.46379635603706665,
       "outcome": "fails"
      },
      {
       "rule": "sqrt",
       "lr": 0.014142135623730952,
       "curve": [
        {
         "samples": 0,
         "loss": 1.508677931362982
        },
        {
         "samples": 2048,
         "loss": 0.8010734937157862
        },
        {
         "samples": 4096,
         "loss": 0.276160726075664
        },
        {
         "samples": 6144,
         "loss": 0.16456205157920334
        },
        {
         "samples": 8192,
         "loss": 0.07583422707158174
        },
        {
         "samples": 10240,
         "loss": 0.05087157024384725
        },
        {
         "samples": 12288,
         "loss": 0.03852972801426721
        },
        {
         "samples": 14336,
         "loss": 0.03560792374397835
        },
        {
         "samples": 16384,
         "loss": 0.03400750064122457
        }
       ],
       "final_loss_ratio": 1.2529385830297783,
       "holds": false,
       "last_interval_fall": 0.04494570125067819,
       "still_falling": true,
       "seed_ratios": [
        1.1877936973241252,
        1.273707281523867,
        1.2973147702413426
       ],
       "ratio_spread": 0.05763870644877784,
       "outcome": "fails"
      },
      {
       "rule": "linear",
       "lr": 0.04,
       "curve": [
        {
         "samples": 0,
         "loss": 1.508677931362982
        },
        {
         "samples": 2048,
         "loss": 0.3771047619052121
        },
        {
         "samples": 4096,
         "loss": 0.24455989913032108
        },
        {
         "samples": 6144,
         "loss": 0.1252451811840866
        },
        {
         "samples": 8192,
         "loss": 0.06352375944551555
        },
        {
         "samples": 10240,
         "loss": 0.040874201347977604
        },
        {
         "samples": 12288,
         "loss": 0.034822921924739444
        },
        {
         "samples": 14336,
         "loss": 0.027888053151104646
        },
        {
         "samples": 16384,
         "loss": 0.026458431821418875
        }
       ],
       "final_loss_ratio": 1.037243229806929,
       "holds": false,
       "last_interval_fall": 0.05126285875674844,
       "still_falling": true,
       "seed_ratios": [
        0.9241243245163624,
        1.1180933234584307,
        1.0695120414459938
       ],
       "ratio_spread": 0.10093042302049025,
       "outcome": "borderline"
      }
     ],
     "best_rule": "linear",
     "tied_for_best": [
      "linear"
     ],
     "plan_rule": "sqrt",
     "plan_rule_holds": false,
     "noise_scale": {
      "start": 15.838166068597635,
      "middle": null,
      "end": null,
      "used": "start",
      "batch_to_noise": 16.163487545920592,
      "linear_overshoot": 5.682453747888134
     },
     "regime": "above_noise_scale",
     "prediction_agrees": null,
     "could_change": [
      "none",
      "sqrt",
      "linear"
     ],
     "settling_samples": 65536,
     "verdict": "at 256, no rule holds: the best, linear scaling to 0.04, lags the 32-sample run over 16,384 samples by 3.7 % (tolerance 5 %); none (lr 0.005) lags by 202.9 %; sqrt (lr 0.01414) lags by 25.3 %; B_noise ~ 15.8 (at its start) puts 256 above noise scale (McCandlish et al. predict linear overshoots by x5.68); over 3 seeds (each rule against its seed's base run); linear is borderline (seeds 0.924 to 1.118 of the base run); still falling when the probe stopped (none fell 19.4 %, sqrt fell 4.5 %, linear fell 5.1 % over the last interval, the base run 2.4 %), so none, sqrt, linear could still change: probe 65,536 samples to settle it"
    },
    "passed": true,
    "gradient_matches": true,
    "controls_detected": true,
    "controls_not_applicable": [
     "unweighted_mean",
     "accumulation_not_divided",
     "whole_global_batch"
    ]
   },
   "error": null,
   "request": {
    "plan": {
     "topology": {
      "num_nodes": 1,
      "gpus_per_node": 2,
      "throughput_curve": null,
      "node_groups": null
     },
     "global_batch_size": 256,
     "micro_batch_size": null,
     "gradient_accumulation_steps": null,
     "max_micro_batch_size": null,
     "divisibility": "exact",
     "parallelism": {
      "tensor": 1,
      "pipeline": 1,
      "context": 1,
      "data_parallel_shard": 1,
      "expert": 1
     },
     "loss_reduction": "mean",
     "dataset": null,
     "learning_rate": {
      "base_lr": 0.005,
      "base_batch_size": 32,
      "rule": "sqrt",
      "optimizer": "sgd",
      "warmup_epochs": null,
      "warmup_steps": 8,
      "betas": [
       0.9,
       0.999
      ],
      "eps": 1e-08,
      "base_batch_tokens": null,
      "warmup_start_lr": null,
      "decay": "linear",
      "min_lr": null,
      "milestones": null,
      "milestone_epochs": null,
      "gamma": 0.1,
      "train_steps": null,
      "train_samples": 65536,
      "momentum": null,
      "nesterov": false,
      "weight_decay": 0.0,
      "max_grad_norm": null,
      "lr_scaling": null,
      "lr_scaling_check": null
     },
     "gradient_noise_scale": null,
     "gradient_noise_scale_stderr": null,
     "sequence_length": null,
     "global_batch_tokens": null,
     "micro_batch_tokens": null,
     "loss_normalization": "sample",
     "packing": null,
     "resume": null,
     "recommend": null
    },
    "model": "synthetic",
    "noise_scale": null,
    "fit_micro_batch": null,
    "backend": "auto",
    "dtype": "float64",
    "seed": 0,
    "timeout_s": null,
    "rendezvous": null,
    "workload": "synthetic",
    "steps": 1,
    "resume": null,
    "throughput": null,
    "lr_scaling": {
     "samples": 16384,
     "epochs": null,
     "rules": null,
     "points": 8,
     "tolerance": null,
     "tolerance_unit": null,
     "seeds": 3,
     "label_noise": 0.0
    }
   }
  }
 }
}"""
)
