"""Iteration-level scheduling: which sequences run in the next forward, and how many tokens each.

Every step, running sequences go first (one token each, plus any speculative drafts, or the next
chunk of an unfinished prefill); waiting sequences are then admitted while the step's token
budget, the sequence limit and the KV pool allow. When a running sequence needs a block and the
pool is empty, the newest running sequence is preempted: its blocks are freed and it goes back to
the head of the waiting queue to be recomputed later (recompute, not swap: on CPU a swap is a
copy to the same memory, and recomputing a prompt is one batched forward).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.generate.blocks import BlockManager
from scalelab.system.generate.sequence import SeqStatus, Sequence


@dataclass(kw_only=True)
class SchedulerConfig:
    max_num_seqs: int = 16
    """Most sequences in one step (the decode batch)."""
    max_batched_tokens: int = 512
    """Token budget of one step; a longer prompt is prefilled in chunks across steps."""
    max_model_len: int = 2048
    """Prompt + output limit per sequence."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1 or self.max_model_len < 2:
            raise BadUsageError("max_num_seqs, max_batched_tokens must be >= 1; max_model_len >= 2")


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int
    """Tokens fed this step: token_ids[num_computed : num_computed + num_tokens], then drafts."""
    drafts: list[int] = field(default_factory=list)
    """Speculative tokens appended after those (verified by this step's logits)."""


@dataclass
class StepPlan:
    """The scheduler's decision for one step, as plain data (the runner executes it)."""

    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens + len(s.drafts) for s in self.scheduled)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.status = SeqStatus.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> StepPlan:
        """drafts: seq_id -> proposed tokens for decoding sequences (speculative decoding)."""
        plan = StepPlan([], [])
        budget = self.cfg.max_batched_tokens
        drafts = drafts or {}
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.in_prefill:
                n = min(len(seq) - seq.num_computed, budget)
                extra: list[int] = []
            else:
                extra = drafts.get(seq.seq_id, [])[: max(0, budget - 1)]
                n = 1
            while not self.blocks.grow(seq, seq.num_computed + n + len(extra)):
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted itself: nothing left to take blocks from
            plan.scheduled.append(ScheduledSeq(seq, n, extra))
            budget -= n + len(extra)
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.allocate(seq):
                break  # first come, first served: later ones wait too
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(len(seq) - seq.num_computed, budget)
            plan.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return plan

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free a finished or aborted sequence's blocks now, wherever it is."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
