"""The engine: one object that wires scheduler, block manager, runner, sampler and drafts.

`step()` runs one iteration (schedule -> forward -> sample/verify -> detokenize -> free the
finished) and returns what each touched sequence produced; `generate()` loops it offline. It is
single-threaded by design: the server drives it from one thread and talks to it through queues.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.nets.llama import LlamaForCausalLM
from scalelab.system.generate.blocks import BlockManager
from scalelab.system.generate.metrics import EngineMetrics
from scalelab.system.generate.quant import check_weights
from scalelab.system.generate.runner import (
    ModelRunner,
    SeqSlice,
    blocks_in_budget,
    kv_bytes_per_token,
)
from scalelab.system.generate.sampling import (
    adjust_logits,
    make_generator,
    sample_one,
    token_logprobs,
)
from scalelab.system.generate.scheduler import Scheduler, SchedulerConfig
from scalelab.system.generate.sequence import SamplingParams, Sequence
from scalelab.system.generate.speculative import SpecConfig, accept_greedy, propose
from scalelab.system.generate.tokenizer import TextTokenizer

MiB = 1 << 20
STEP_HISTORY = 100_000


@dataclass(kw_only=True)
class LlmEngineConfig:
    kv_cache_bytes: int = 256 * MiB
    """Memory for keys and values, allocated once at start; sets how many blocks exist."""
    block_size: int = 16
    """Token slots per KV block."""
    max_num_seqs: int = 16
    """Most sequences decoded together in one step."""
    max_batched_tokens: int = 512
    """Token budget of one step (long prompts are prefilled in chunks of at most this)."""
    max_model_len: int = 2048
    """Prompt + output limit per request (at most the model's context length)."""
    prefix_caching: bool = True
    """Reuse the KV blocks of identical prompt prefixes (chained block hashes)."""
    speculative: bool = False
    """Prompt-lookup drafting for greedy requests, verified in one target forward."""
    spec: SpecConfig = field(default_factory=SpecConfig)
    contiguous: bool = False
    """Baseline: every sequence reserves max_model_len slots up front (one block of that size),
    as a cache without paging must; the paged-vs-contiguous benchmark compares the two."""
    packed_weights: bool = True
    """Run the linear layers from oneDNN-blocked copies of the weights on CPU (fp32): a SmolLM2
    decode step at 8 sequences in 0.69x the time. The model is converted in place once; its
    state dict is unchanged. Off: plain `nn.Linear` (the equivalence tests' reference)."""
    weights: str = "fp32"
    """How the linears hold their weights: fp32, int8 (per-channel, from fp32) or q4 (the
    GGUF's own 4/8-bit blocks); applied when the model is loaded (`load_model(weights=...)`),
    checked here (scalelab.system.generate.quant)."""

    def __post_init__(self) -> None:
        if isinstance(self.spec, dict):  # from JSON settings (the server's environment)
            self.spec = SpecConfig(**self.spec)
        check_weights(self.weights)
        if self.kv_cache_bytes < 1 or self.block_size < 1:
            raise BadUsageError("kv_cache_bytes and block_size must be >= 1")
        if self.contiguous:
            self.block_size = self.max_model_len
            self.prefix_caching = False


@dataclass
class EngineStats:
    """Plain counters (metrics has the histograms); benchmarks and tests read these."""

    steps: int = 0
    prefill_tokens: int = 0
    """Prompt (or recomputed) tokens run through the model, prefix-cache hits excluded."""
    decode_tokens: int = 0
    tokens_per_step: deque[int] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    """Tokens of each of the last STEP_HISTORY steps (a server steps for weeks: a list grew
    without bound; the Prometheus histograms keep the whole run)."""
    seqs_per_step: deque[int] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    max_running: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class StepOutput:
    seq: Sequence
    text: str
    """New text since the last output (held back while it may be a stop string's start)."""
    num_new_tokens: int
    finished: bool


class LlmEngine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: TextTokenizer,
        cfg: LlmEngineConfig,
        *,
        name: str = "model",
        metrics: EngineMetrics | None = None,
    ) -> None:
        if cfg.max_model_len > model.cfg.max_position_embeddings:
            raise BadUsageError(
                f"max_model_len={cfg.max_model_len} exceeds the model's context of "
                f"{model.cfg.max_position_embeddings} tokens"
            )
        self.cfg = cfg
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        num_blocks = blocks_in_budget(model.cfg, cfg.kv_cache_bytes, cfg.block_size)
        if num_blocks < 1:
            raise BadUsageError(
                f"--kv-cache-bytes {cfg.kv_cache_bytes} holds no block of {cfg.block_size} "
                f"tokens ({kv_bytes_per_token(model.cfg) * cfg.block_size} bytes); raise it"
            )
        self.blocks = BlockManager(num_blocks, cfg.block_size, cfg.prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=cfg.max_num_seqs,
                max_batched_tokens=cfg.max_batched_tokens,
                max_model_len=cfg.max_model_len,
            ),
            self.blocks,
        )
        self.runner = ModelRunner(model, num_blocks, cfg.block_size, packed=cfg.packed_weights)
        self.metrics = metrics
        self.stats = EngineStats()
        self._generators: dict[int, torch.Generator | None] = {}

    # -- requests -------------------------------------------------------------------------------

    def check_lengths(self, num_prompt: int, max_tokens: int) -> None:
        """400-worthy problems with a request's size, before it takes any memory."""
        if num_prompt < 1:
            raise BadInputError("the prompt is empty; send at least one token")
        if num_prompt >= self.cfg.max_model_len:
            raise BadInputError(
                f"the prompt has {num_prompt} tokens; max_model_len is {self.cfg.max_model_len} "
                "(prompt + output): shorten the prompt"
            )
        total = min(num_prompt + max_tokens, self.cfg.max_model_len)
        if self.blocks.blocks_for(total) > self.blocks.num_blocks:
            raise BadInputError(
                f"prompt + max_tokens = {total} tokens needs more KV memory than the whole pool "
                f"({self.blocks.num_blocks * self.cfg.block_size} tokens); lower max_tokens"
            )

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        self.check_lengths(len(prompt_ids), params.max_tokens)
        seq = Sequence(list(prompt_ids), params)
        self._generators[seq.seq_id] = make_generator(params)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Drop a request now (client gone, deadline passed): its blocks are free on return."""
        if not seq.finished:
            self.scheduler.finish(seq, reason)
            self._generators.pop(seq.seq_id, None)
            if self.metrics:
                self.metrics.finished(seq, time.perf_counter())

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- one iteration --------------------------------------------------------------------------

    def _drafts(self) -> dict[int, list[int]]:
        if not self.cfg.speculative:
            return {}
        out: dict[int, list[int]] = {}
        for seq in self.scheduler.running:
            if seq.in_prefill or not seq.params.greedy or seq.params.adjusts_logits:
                continue
            room = min(
                seq.params.max_tokens - seq.num_output - 1, self.cfg.max_model_len - len(seq) - 1
            )
            if room > 0:
                d = propose(seq.token_ids, self.cfg.spec)[:room]
                if d:
                    out[seq.seq_id] = d
        return out

    def step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(self._drafts())
        if not plan.scheduled:
            return []
        slices: list[SeqSlice] = []
        for s in plan.scheduled:
            seq = s.seq
            if seq.scheduled_at is None:
                seq.scheduled_at = t0
            end = seq.num_computed + s.num_tokens
            completes = end == len(seq)
            slices.append(
                SeqSlice(
                    tokens=seq.token_ids[seq.num_computed : end] + s.drafts,
                    start=seq.num_computed,
                    block_table=seq.block_table,
                    logits_rows=(1 + len(s.drafts)) if completes else 0,
                )
            )
        logits = self.runner.run(slices)
        now = time.perf_counter()
        outputs: list[StepOutput] = []
        row = 0
        prefill = decode = 0
        for s, sl in zip(plan.scheduled, slices, strict=True):
            seq = s.seq
            if seq.in_prefill:
                prefill += s.num_tokens
            else:
                decode += s.num_tokens
            seq.num_computed += s.num_tokens
            if sl.logits_rows == 0:
                self.blocks.register_full_blocks(seq)
                continue
            rows = logits[row : row + sl.logits_rows]
            row += sl.logits_rows
            if s.drafts:
                targets = rows.argmax(-1).tolist()
                new = accept_greedy(s.drafts, targets)
                self.stats.draft_tokens += len(s.drafts)
                self.stats.accepted_tokens += len(new) - 1
                if self.metrics:
                    self.metrics.spec(len(s.drafts), len(new) - 1)
            else:
                choose_from = (adjust_logits(rows[0], seq.params, seq.output_ids)
                               if seq.params.adjusts_logits else rows[0])
                new = [sample_one(choose_from, seq.params, self._generators.get(seq.seq_id))]
            if seq.params.logprobs is not None:  # row i is the logits new[i] was chosen from
                seq.logprobs.extend(token_logprobs(rows, new, seq.params.logprobs))
            outputs.append(self._append(seq, new, now))
        self.stats.steps += 1
        self.stats.prefill_tokens += prefill
        self.stats.decode_tokens += decode
        self.stats.tokens_per_step.append(plan.num_tokens)
        self.stats.seqs_per_step.append(len(plan.scheduled))
        self.stats.max_running = max(self.stats.max_running, len(plan.scheduled))
        if self.metrics:
            self.metrics.step(self, plan.num_tokens, prefill, decode, now - t0, len(plan.preempted),
                              generated=sum(o.num_new_tokens for o in outputs))
        return outputs

    def _append(self, seq: Sequence, new: list[int], now: float) -> StepOutput:
        reason: str | None = None
        added = 0
        for tok in new:
            seq.token_ids.append(tok)
            added += 1
            if tok in self.tokenizer.eos_ids and not seq.params.ignore_eos:
                seq.token_ids.pop()  # the EOS itself is not output
                added -= 1
                reason = "stop"
                break
            if seq.num_output >= seq.params.max_tokens or len(seq) >= self.cfg.max_model_len:
                reason = "length"
                break
        if seq.params.logprobs is not None:  # tokens after an EOS or the length limit
            del seq.logprobs[seq.num_output:]
        # The KV of every token but the newest is written (rejected drafts' slots are simply
        # overwritten later); the newest is fed in the next step.
        seq.num_computed = len(seq) - 1
        self.blocks.register_full_blocks(seq)
        if seq.first_token_at is None:
            seq.first_token_at = now
            if self.metrics:
                self.metrics.first_token(seq, now)
        elif self.metrics and added:
            self.metrics.inter_token(seq, now)
        seq.last_token_at = now
        checked = len(seq.text)
        base = seq.num_prompt  # offsets are into the output; no copy of it a step
        piece, prefix, read = self.tokenizer.decode_next(
            seq.token_ids, base + seq.detok_prefix, base + seq.detok_read,
            final=reason is not None)
        seq.detok_prefix, seq.detok_read = prefix - base, read - base
        seq.text += piece
        if piece and seq.params.stop:
            # only where the new text could complete a stop string: O(new), not O(text)
            since = max(0, checked - max(len(s) for s in seq.params.stop) + 1)
            for stop in seq.params.stop:
                at = seq.text.find(stop, since)
                if at >= 0:
                    seq.text = seq.text[:at]
                    reason = "stop"
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self._generators.pop(seq.seq_id, None)
            if self.metrics:
                self.metrics.finished(seq, now)
        return StepOutput(seq, self._delta(seq), added, seq.finished)

    def _delta(self, seq: Sequence) -> str:
        """Text not yet handed out, minus what might still change: a trailing partial UTF-8
        character (decoded as U+FFFD) or the start of a stop string."""
        end = len(seq.text)
        if not seq.finished:
            while end > seq.sent_chars and seq.text[end - 1] == "\ufffd":
                end -= 1
            if seq.params.stop:
                hold = max(len(s) for s in seq.params.stop) - 1
                end = max(seq.sent_chars, end - hold)
        delta = seq.text[seq.sent_chars : end]
        seq.sent_chars = end
        return delta

    # -- offline --------------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Sequence]:
        """Run prompts to completion (continuous batching over all of them)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.has_work():
            self.step()
        return seqs
