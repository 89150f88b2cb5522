"""Every constant of the capacity and speed estimator, each with its source.

Three kinds:

- **Format facts** (bits per weight of a quantisation, bytes per cached token row of a KV layout): from the format's
  own definition, named beside each value.
- **Datasheet facts** per hardware class (memory bandwidth): from the vendor's datasheet.
- **Calibrated constants** per hardware class (fixed cost per decode round, achieved compute, ...): fitted by
  `ds4deploy.plan.estimate.calibrate.fit` on the published cells named in ``fitted_on``; every other published
  cell is a prediction, back-tested in docs/estimator.md (``make estimate-backtest``). docs/sources.md#estimator says
  where each published figure comes from.

Units: GB = 10**9 bytes, GiB = 2**30 bytes, GB/s for memory bandwidth, s for times, tok/s for rates.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# --- quantisation: bits per weight, scales included ---------------------------------------------------------------
# mxfp4: 4-bit E2M1 values plus one 8-bit E8M0 scale per 32 values (OCP Microscaling Formats v1.0, section 5.3) = 4.25.
# fp8 with 128x128 block scales: 8 bits plus one fp32 scale per 16,384 values (DeepSeek's block FP8,
#   quantization_config.weight_block_size [128, 128]) = 8.002.
# iq2_xxs: ggml's block_iq2_xxs holds 256 weights in 66 bytes (one fp16 scale + 64 bytes of grid indices and signs;
#   ggml/src/ggml-common.h) = 2.0625.
# bf16 / float16 / float32: 16 / 16 / 32.
QUANT_BITS: dict[str, float] = {
    "mxfp4": 4.25,
    "fp8": 8 + 32 / (128 * 128),
    "iq2_xxs": 66 * 8 / 256,
    # q8_0: ggml's block_q8_0 holds 32 weights in 34 bytes (fp16 scale + 32 int8) = 8.5.
    "q8_0": 34 * 8 / 32,
    "bfloat16": 16.0,
    "float16": 16.0,
    "float32": 32.0,
}
# The checkpoint's expert_dtype (config.json) -> the quantisation above (DeepSeek V4: routed experts in MXFP4).
EXPERT_DTYPE_QUANT = {"fp4": "mxfp4", "fp8": "fp8", "bf16": "bfloat16"}
# The recipe's model.dtype -> bytes per weight in memory for a dense checkpoint ("auto" keeps the stored dtype).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4}

# --- KV cache layouts of vLLM's DeepSeek V4 attention (bytes per cached row) --------------------------------------
# vLLM vllm/models/deepseek_v4/attention.py (DeepseekV4Attention.get_kv_cache_spec): fp8_ds_mla stores per row
# 448 B of fp8 NoPE + 128 B of bf16 RoPE + 8 B of scales = 584 B (state_content_bytes=584); a layer with compress
# ratio r > 1 stores one row per r tokens; layers with ratio 0/1 keep only the sliding window.
# "auto" stores the 512-wide row in bf16 (1,024 B). nvfp4_ds_mla: the B12x backend's own 432-byte row is refused for
# MLA models by upstream vLLM, and the community builds that serve the name keep fp8's 584-byte page
# (eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml, "NVFP4 KV IS NOT AN OPTION"): counted as 584.
DSV4_ROW_BYTES = {"fp8_ds_mla": 584, "fp8": 584, "nvfp4_ds_mla": 584, "auto": 1024, "bfloat16": 1024}
# The sparse indexer's key cache on ratio-4 layers (DeepseekV4IndexerCache, same file): index_head_dim fp8 values
# plus one fp32 scale = 128 + 4 = 132 B per compressed row.
DSV4_INDEX_ROW_EXTRA = 4
# Compressor state kept per in-flight token (DeepseekCompressor / CompressorStateCache, vllm/models/deepseek_v4/
# compressor.py): fp32 kv_state + score_state, 2 x coff x head_dim x 4 B, coff = 2 on ratio-4 layers (overlap), 1
# otherwise.
FP32_BYTES = 4

# How the pinned engine accounts the DeepSeek V4 KV cache, beyond the physical rows above: vLLM's hybrid KV manager
# pads every cache group to one page size and reserves the sliding-window and compressor-state groups for
# max_num_batched_tokens in-flight tokens per request. Fitted on two published boot refusals of the GB10 vLLM
# DeepSeek-V4-Flash-0731 stack (TP 2, fp8_ds_mla, max_model_len 1,048,576): 11.04 GiB needed for one request at
# max_num_batched_tokens 8,192 and 17.85 GiB at 16,384 (eugr/spark-vllm-docker at
# 00afef20fb36094c37297f1118f83dd0802d144c, recipes/deepseek-v4-flash-0731-1m.yaml). The two factors (engine bytes over
# physical bytes, per context token and per in-flight token) are solved from these two figures by
# `ds4deploy.plan.estimate.model.engine_kv_factors`.
ENGINE_KV_ACCOUNTING = {
    "vllm-dsv4": {
        "flavors": ("gb10-community", "vllm"),
        # The page layouts the figures were taken with (nvfp4_ds_mla: the same 584-byte page, above).
        "dtypes": ("fp8_ds_mla", "fp8", "nvfp4_ds_mla"),
        "fitted_on": "eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml: 11.04 GiB (8,192 batched) and "
                     "17.85 GiB (16,384 batched) for one 1,048,576-token request, fp8_ds_mla, TP 2",
        "published": ((1_048_576, 8192, 11.04), (1_048_576, 16384, 17.85)),
    },
}
# vLLM's default max_num_batched_tokens for the OpenAI API server on a GPU (vllm/engine/arg_utils.py,
# EngineArgs._set_default_args: 8192 for UsageContext.OPENAI_API_SERVER) and on the CPU backend (4096).
DEFAULT_BATCHED_TOKENS = {"gpu": 8192, "cpu": 4096}
# vLLM's CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), default 4 (vllm/envs.py).
CPU_KVCACHE_SPACE_DEFAULT_GIB = 4.0

# --- speculative decoding: expected accepted drafts ---------------------------------------------------------------
# Tokens per verify round with k drafts each accepted with probability p in turn: 1 + p + p^2 + ... + p^k.
# Per-content acceptance where the reference system publishes it (docs/sources.md#v100x8-acceptance: code and JSON
# accept 3.6-3.8 of 5 drafts, legal ~1.6, prose ~1.2), as accepted drafts per round; GX10: 83-87 % draft acceptance
# (docs/sources.md#gx10-pair), midpoint 0.85 per draft token. "chat" on the V100 system is fitted (see
# HARDWARE["sm70-v100"]["fitted_on"]).
ACCEPTED_PER_ROUND = {"code": 3.7, "json": 3.7, "legal": 1.6, "prose": 1.2}
DEFAULT_ACCEPTANCE_RATE = 0.85

# --- hardware classes ---------------------------------------------------------------------------------------------
# datasheet: memory bandwidth per GPU (GB/s) and, for CPU-resident experts, the host's DRAM bandwidth.
# fitted: t_round_s (fixed cost of one decode round), ctx_s (decode cost per token of context per session per round),
#   tflops (achieved prefill compute per GPU, 10**12 FLOP/s, from 2 FLOP per active weight), attn_s (prefill cost per
#   token per token of context before it), t_req_s (per-request cost before the first token), chat_accepted (V100
#   chat drafts accepted per round), share (fraction of a draft token's experts not already touched by the token
#   before it in the same session: 1 = independent).
HARDWARE: dict[str, dict] = {
    "sm70-v100": {
        "title": "Tesla V100-SXM2-32GB (sm70)",
        # NVIDIA Tesla V100 datasheet: 900 GB/s HBM2.
        "bw_gbs": 900.0,
        "bw_source": "NVIDIA Tesla V100 datasheet (900 GB/s HBM2)",
        "fitted": {"t_round_s": 0.0174, "ctx_s": 1.506e-08, "tflops": 60.27, "attn_s": 0.0, "t_req_s": 0.2242,
                   "chat_accepted": 1.191, "share": 1.0, "prefill_share": 1.0},
        # share / prefill_share are not identifiable from one-session tables: 1 (independent routing).
        "fitted_on": ["A-p1024-c1-round_s", "A-p262144-c1-round_s", "A-p1024-c1-chat-per_session_tok_s",
                      "A-p1024-c1-ttft_s", "A-p1024-c1-prefill_tok_s", "A-p65536-c1-ttft_s", "A-p262144-c1-ttft_s"],
    },
    "sm121-gb10": {
        "title": "NVIDIA GB10 (DGX Spark / GX10, sm121), unified LPDDR5x",
        # NVIDIA DGX Spark datasheet: 273 GB/s LPDDR5x, shared by CPU and GPU.
        "bw_gbs": 273.0,
        "bw_source": "NVIDIA DGX Spark datasheet (273 GB/s LPDDR5x, unified)",
        "fitted": {"t_round_s": 0.03081, "ctx_s": 4.051e-08, "tflops": 55.61, "attn_s": 2.161e-09,
                   "t_req_s": 0.07715, "share": 0.7146, "prefill_share": 0.05905},
        "fitted_on": ["B-p256-c1-per_session_tok_s", "B-p524288-c1-per_session_tok_s", "B-p256-c6-per_session_tok_s",
                      "B-p256-c12-per_session_tok_s", "B-p256-c1-prefill_tok_s", "B-p256-c1-ttft_s",
                      "B-p256-c6-ttft_s", "B-p32768-c1-ttft_s", "B-p524288-c1-ttft_s"],
    },
    "sm86-rtx3090-xeon": {
        "title": "RTX 3090 (sm86) + Xeon Platinum 8268 x4, routed experts in host DRAM",
        # NVIDIA GeForce RTX 3090 specifications: 936 GB/s GDDR6X. Host: 4 sockets x 6 channels x DDR4-2933 x 8 B
        # = 563 GB/s (Intel Xeon Platinum 8268 ark page: 6 channels, DDR4-2933).
        "bw_gbs": 936.0,
        "host_bw_gbs": 4 * 6 * 2933e6 * 8 / 1e9,
        "bw_source": "NVIDIA RTX 3090 specifications (936 GB/s); Intel ark Xeon Platinum 8268 (6 x DDR4-2933 per "
                     "socket, 4 sockets)",
        # host_bw_gbs here is the achieved rate (fitted); the datasheet figure is the class's host_bw_gbs. Prefill is
        # not calibrated: the owner publishes no prefill or TTFT figure.
        "fitted": {"t_round_s": 0.07436, "host_bw_gbs": 422.5, "share": 1.0},
        "fitted_on": ["C-p256-c1-per_session_tok_s", "C-p256-c4-aggregate_tok_s"],
    },
    "cpu-x86": {
        "title": "x86-64 CPU host (vLLM CPU backend)",
        # No datasheet figure for a CI virtual machine: the bytes term is negligible for the tiny model (2.7 MB per
        # round), so bandwidth is not calibrated; everything else is, from the cpu stack's own bench run.
        "bw_gbs": None,
        "bw_source": "not known for a virtual machine; the tiny model's bytes per round are negligible",
        # `ds4deploy estimate cpu --calibrate docs/results/bench/cpu/smoke/run.json` (tests/unit/test_estimate.py
        # fits it again and compares).
        "fitted": {"ctx_s": 0.0, "attn_s": 0.0, "t_round_s": 0.002379, "t_req_s": 0.02357, "tflops": 0.1484},
        "fitted_on": ["docs/results/bench/cpu/smoke/run.json (TTFT and aggregate of its 8 cells)"],
    },
}


class Fitted(BaseModel):
    """The calibrated constants of one hardware class, as `HARDWARE[...]["fitted"]` and an owner's calibration file
    (``recipes/<recipe>.calibration.json``, `ds4deploy.plan.estimate.read_calibration`) hold them: every one a finite
    number (no string, no bool). Costs and rates every step multiplies or divides by are > 0: at 0 a decode round or a
    request takes no time and the estimate prints any rate at all. ``ctx_s`` and ``attn_s`` may be 0: the fit leaves
    them out at 0 when a run's prompts span less than a factor 8 (`calibrate.calibrate`). ``prefill_share`` is a
    fraction (`calibrate.AT_MOST_ONE`)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    t_round_s: float = Field(gt=0)
    ctx_s: float | None = Field(default=None, ge=0)
    tflops: float | None = Field(default=None, gt=0)
    attn_s: float | None = Field(default=None, ge=0)
    t_req_s: float | None = Field(default=None, gt=0)
    chat_accepted: float | None = Field(default=None, ge=0)
    share: float | None = Field(default=None, gt=0)
    prefill_share: float | None = Field(default=None, gt=0, le=1)
    bw_gbs: float | None = Field(default=None, gt=0)
    host_bw_gbs: float | None = Field(default=None, gt=0)

    def constants(self) -> dict:
        """The constants as the simulation reads them (`model.simulate`): only those given."""
        return self.model_dump(exclude_none=True)


# --- bounds of a workload -----------------------------------------------------------------------------------------
# The simulation (`model.simulate`) keeps one request per session and steps the engine's scheduler over the first
# max_num_seqs of them, so its time is engine steps x (requests running + a fixed part). Measured on the 2-core CI
# machine (Python 3.11, lightly loaded): 2.5 us per step plus 0.16 us per request running, i.e. one step costs as
# much as STEP_COST_REQUESTS running requests; `model.planned_work` counts a workload in these units (0.15 us each
# there, 0.5 us while another job holds both cores).
STEP_COST_REQUESTS = 16
# One estimate (`ds4deploy estimate`, `speed`): 20,000,000 units, about 3 s there (10 s on a busy machine). The
# committed recipes' defaults need at most 35,000 (cpu, one session); --sessions 1024 on the cpu recipe (max_num_seqs
# 4, 2,048 tokens out) 10,500,000.
MAX_SIM_WORK = 20_000_000
# Sessions of one estimate or bench cell. Past serving.max_num_seqs sessions only wait in the engine's queue, which a
# few hundred show as well as millions; 1,024 is 85 x the largest max_num_seqs of a committed recipe (12, the
# gx10x2 many-users variant) and keeps the simulation's list of requests small (memory grows with the count).
MAX_SESSIONS = 1024
# A calibration fit (`calibrate.fit`) simulates every distinct cell of the run again at each evaluation, about 600
# evaluations (560 for the cpu smoke run): 1,000,000 units per evaluation (0.15 s there, a fit of about 1.5 min) is
# twice what the largest committed profile needs (context-sweep on gx10x2-ds4-flash-fp8--many-users: 514,000).
MAX_FIT_WORK = 1_000_000
