"""The transformer trainer's pure parts: corpus packing, parallel dims, pipeline split and
bubble theory, the communication pairing rule, activation counting, config checks."""

from __future__ import annotations

import pytest
import torch

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.llama import LlamaForCausalLM, init_weights
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.dims import ParallelDims
from scalelab.system.train.parallel.measure import ActivationMeter, comm_from_events, kind_of_c10d
from scalelab.system.train.parallel.pipeline import (
    StageModule,
    bubble_floor,
    bubble_theory,
    replay,
    replay_bubble,
    stage_layers,
)
from scalelab.system.train.text import EOS, batch_at, decode, load_corpus


def test_corpus_is_packed_seeded_and_held_out(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "a.py").write_bytes(b"x" * 25)
    (root / "b.py").write_bytes(b"y" * 25)
    (root / "c.txt").write_bytes(b"ignored")
    c = load_corpus(seq=9, max_tokens=1000, seed=1, val_fraction=0.2, root=root)
    # 25 + EOS + 25 + EOS = 52 tokens -> 5 sequences of 10; 1 held out (the stream's last).
    assert (c.tokens, c.files, tuple(c.train.shape), tuple(c.val.shape)) == (52, 2, (4, 10),
                                                                            (1, 10))
    assert decode(c.val[0].tolist()) == b"y" * 10
    stream = sorted(map(tuple, c.train.tolist()))
    assert stream == sorted(map(tuple, torch.tensor(
        [*b"x" * 25, EOS, *b"y" * 25, EOS])[:40].view(4, 10).tolist()))
    again = load_corpus(seq=9, max_tokens=1000, seed=1, val_fraction=0.2, root=root)
    assert torch.equal(c.train, again.train) and c.digest == again.digest
    # Step k's batch is rows k*b..k*b+b-1, cycling.
    assert torch.equal(batch_at(c.train, 1, 3), c.train[[3, 0, 1]])
    with pytest.raises(BadUsageError, match="exceeds the 4 training sequences"):
        batch_at(c.train, 0, 5)


def test_stdlib_corpus_reads_the_interpreters_sources() -> None:
    c = load_corpus(seq=63, max_tokens=20_000, seed=0)
    assert c.tokens == 20_000 and c.train.shape[1] == 64 and c.files >= 1
    assert int(c.train.max()) <= EOS


def test_dims_by_strategy_and_mesh_shape() -> None:
    assert ParallelDims.for_strategy("fsdp+tp", 4, tp=2).mesh_shape() == ((2, 2),
                                                                          ("dp_shard", "tp"))
    d = ParallelDims.for_strategy("fsdp+tp", 4, tp=2)
    assert [d.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert ParallelDims.for_strategy("pp", 3).mesh_shape() == ((3,), ("pp",))
    assert ParallelDims.for_strategy("dp", 2).dp == 2 and ParallelDims.for_strategy("tp", 2).dp == 1
    with pytest.raises(BadUsageError, match="TP groups of 3"):
        ParallelDims.for_strategy("fsdp+tp", 4, tp=3)
    with pytest.raises(BadUsageError, match="HSDP"):
        ParallelDims(dp_replicate=2, dp_shard=2)


def test_bubble_theory_and_stage_split() -> None:
    assert bubble_theory(2, 4) == pytest.approx(1 / 5)
    assert bubble_theory(4, 8) == pytest.approx(3 / 11)
    assert bubble_theory(1, 4) == 0.0
    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(stage_layers(4, 4, s)) for s in range(4)] == [[0], [1], [2], [3]]


def test_stages_keep_the_full_models_names_and_compose_to_it() -> None:
    cfg = ParallelConfig.from_flags(layers=3, hidden=32, heads=2, kv_heads=2, ffn=64, seq=16)
    full = init_weights(LlamaForCausalLM(cfg.model_config()), seed=0)
    s0, s1 = StageModule(full, 0, 2), StageModule(full, 1, 2)
    names = set(s0.state_dict()) | set(s1.state_dict())
    assert names == set(full.state_dict())
    assert "model.layers.2.mlp.up_proj.weight" in s1.state_dict()
    x = torch.randint(0, 257, (2, 16))
    with torch.no_grad():
        assert torch.equal(s1(s0(x)), full(x))


def test_comm_pairing_takes_kind_from_c10d_time_and_dtype_from_gloo() -> None:
    ev = [
        ("c10d::_reduce_scatter_base_", 0.0, 0.001, [[100], [200]], ["", ""]),
        ("gloo:all_reduce", 0.002, 0.010, [[200]], ["float"]),
        ("c10d::_allgather_base_", 0.02, 0.001, [[200], [100]], ["", ""]),
        ("gloo:all_gather", 0.021, 0.004, [[100]], ["float"]),
        ("gloo:send", 0.03, 0.002, [[50]], ["long int"]),
    ]
    s = comm_from_events(ev)
    assert s.calls == {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 1, "p2p": 1,
                       "broadcast": 0, "other": 0}
    assert s.bytes["reduce_scatter"] == 800 and s.bytes["all_gather"] == 800
    assert s.bytes["p2p"] == 400
    assert s.seconds["reduce_scatter"] == pytest.approx(0.010)
    per = s.per_step(2)
    assert per["all_gather"]["bandwidth_bytes_per_s"] == pytest.approx(800 / 0.004)
    assert per["p2p"]["calls"] == 0.5
    assert kind_of_c10d("c10d::allreduce_") == "all_reduce"
    assert kind_of_c10d("c10d::recv_") == "p2p"


def test_activation_meter_counts_saved_storages_not_parameters() -> None:
    lin = torch.nn.Linear(8, 8, bias=False)
    meter = ActivationMeter(lin)
    x = torch.randn(4, 8, requires_grad=True)
    with meter.track():
        y = torch.relu(lin(x))  # linear saves x (and its weight), relu its output
        loss = y.sum()
    assert meter.peak == 2 * 4 * 8 * 4
    loss.backward()
    del y, loss
    import gc

    gc.collect()
    assert meter.live == 4 * 8 * 4  # x itself is still alive here


@pytest.mark.parametrize("kw, world, needle", [
    ({"strategy": "tp", "kv_heads": 2}, 4, "divisible by 4"),
    ({"strategy": "pp", "layers": 2}, 3, "at least 3 layers"),
    ({"strategy": "dp", "batch": 6}, 4, "does not split over 4"),
    ({"strategy": "single"}, 2, "--nproc 1"),
    ({"strategy": "pp", "batch": 6, "micro_batches": 4}, 2, "--micro-batches 4"),
])
def test_config_refuses_what_cannot_run(kw: dict[str, object], world: int, needle: str) -> None:
    with pytest.raises(BadUsageError, match=needle):
        ParallelConfig.from_flags(**kw).check_world(world)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(BadUsageError, match="--strategy must be one of"):
        ParallelConfig.from_flags(strategy="zz")
    with pytest.raises(BadUsageError, match="--layers must be >= 1"):
        ParallelConfig.from_flags(layers=0)


def test_bubble_floor_is_theory_with_a_core_per_stage_else_the_cpu_share() -> None:
    assert bubble_floor(2, 8, 2) == pytest.approx(1 / 9)
    assert bubble_floor(4, 8, 4) == pytest.approx(3 / 11)
    # 4 stages on 2 cores: each is busy at most half the step, whatever the schedule.
    assert bubble_floor(4, 8, 2) == pytest.approx(0.5)
    assert bubble_floor(4, 2, 2) == pytest.approx(3 / 5)
    with pytest.raises(BadUsageError, match="cores must be >= 1"):
        bubble_floor(2, 8, 0)


def _gpipe(p: int, m: int, f: float, b: float) -> list[list[tuple[str, int, float]]]:
    return [[("F", j, f) for j in range(m)] + [("B", j, b) for j in range(m)] for _ in range(p)]


def test_replay_of_equal_chunks_is_the_theory() -> None:
    # GPipe, 2 stages, 4 micro-batches, F 1 s, B 2 s: (m + p - 1)(f + b) = 15 s, busy 12 s.
    makespan, busy = replay(_gpipe(2, 4, 1.0, 2.0))
    assert (makespan, busy) == (15.0, [12.0, 12.0])
    assert replay_bubble(_gpipe(2, 4, 1.0, 2.0)) == pytest.approx(bubble_theory(2, 4))
    assert replay_bubble(_gpipe(4, 8, 1.0, 2.0)) == pytest.approx(bubble_theory(4, 8))
    # 1F1B on 2 stages, 2 micro-batches (stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1), F 1, B 1:
    # stage 1 runs F0 at 1-2, B0 2-3, F1 3-4, B1 4-5; stage 0 B0 at 3-4, B1 at 5-6.
    one_f_one_b = [[("F", 0, 1.0), ("F", 1, 1.0), ("B", 0, 1.0), ("B", 1, 1.0)],
                   [("F", 0, 1.0), ("B", 0, 1.0), ("F", 1, 1.0), ("B", 1, 1.0)]]
    assert replay(one_f_one_b) == (6.0, [4.0, 4.0])


def test_replay_charges_an_unequal_stage_to_the_schedule_not_to_transfers() -> None:
    # The last stage's forward costs 2 s (the head and the loss): stage 0 waits on it.
    orders = [[("F", 0, 1.0), ("F", 1, 1.0), ("B", 0, 1.0), ("B", 1, 1.0)],
              [("F", 0, 2.0), ("F", 1, 2.0), ("B", 0, 1.0), ("B", 1, 1.0)]]
    # Stage 1: F0 1-3, F1 3-5, B0 5-6, B1 6-7; stage 0: B0 6-7, B1 7-8.
    assert replay(orders) == (8.0, [4.0, 6.0])
    assert replay_bubble(orders) == pytest.approx(((1 - 4 / 8) + (1 - 6 / 8)) / 2)
    with pytest.raises(ValueError, match="deadlock"):
        replay([[("B", 0, 1.0)], [("F", 0, 1.0), ("B", 1, 1.0)]])


@pytest.mark.parametrize("strategy, world, on", [
    ("single", 1, set()), ("dp", 4, {"dp_replicate"}), ("fsdp", 4, {"dp_shard"}),
    ("tp", 2, {"tp"}), ("pp", 3, {"pp"}), ("fsdp+tp", 4, {"dp_shard", "tp"}),
    ("fsdp", 1, set()),
])
def test_a_strategy_becomes_degrees_once(strategy: str, world: int, on: set[str]) -> None:
    d = ParallelDims.for_strategy(strategy, world)
    got = {n for n in ("dp_replicate", "dp_shard", "tp", "pp") if d.enabled(n)}
    assert got == on
    assert d.world == world
    assert d.sharded == bool(on & {"dp_shard", "tp"})


def test_one_rank_parallelizes_to_the_plain_model() -> None:
    from scalelab.layers.nets.llama import LlamaConfig
    from scalelab.system.train.parallel.apply import PipelineSettings, parallelize

    model = init_weights(LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
        num_kv_heads=2, max_position_embeddings=8, tie_word_embeddings=False)), seed=0)
    par = parallelize(model, ParallelDims.for_strategy("pp", 1), None, rank=0, device="cpu",
                      pipeline=PipelineSettings(micro_batches=2, schedule="1f1b",
                                                recv_ahead=True, loss_fn=lambda a, b: a.sum()))
    assert par.model is model and par.forward is model
    assert par.schedule is None and par.clock is None


def test_config_is_in_sections_and_reads_back(tmp_path: object) -> None:
    from pathlib import Path

    cfg = ParallelConfig.from_flags(strategy="tp", hidden=32, heads=2, kv_heads=2, seq=16,
                                    batch=4, checkpoint_every=3, profile_steps=0, steps=5)
    assert (cfg.parallel.strategy, cfg.model.hidden, cfg.data.seq, cfg.data.batch,
            cfg.checkpoint.every, cfg.measure.profile_steps, cfg.steps) == ("tp", 32, 16, 4, 3,
                                                                           0, 5)
    assert set(cfg.to_dict()) == {"model", "data", "parallel", "checkpoint", "measure", "steps",
                                  "lr", "seed", "deterministic", "threads"}
    path = Path(str(tmp_path)) / "config.json"
    cfg.write(path)
    assert ParallelConfig.read(path) == cfg
    other = cfg.replace(checkpoint_every=0, strategy="dp", lr=0.5)
    assert (other.checkpoint.every, other.parallel.strategy, other.lr) == (0, "dp", 0.5)
    assert (cfg.checkpoint.every, cfg.parallel.strategy) == (3, "tp")
    assert other.model == cfg.model and other.run_key(2) != cfg.run_key(2)


def test_the_old_flat_config_gets_a_migration_error() -> None:
    with pytest.raises(BadUsageError, match=r"old flat form \(top-level batch, hidden, "
                                            r"strategy\).*sections.*from_flags"):
        ParallelConfig.from_dict({"strategy": "dp", "hidden": 64, "batch": 8, "steps": 3})
    with pytest.raises(TypeError, match="no field 'hiden'"):
        ParallelConfig.from_flags(hiden=3)
