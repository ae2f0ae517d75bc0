"""Astraea end to end: rebalancing, mediator chains, and runs in FedLab standalone and FedML sp."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import digits_run, records

from fl_adapters.astraea import AstraeaPlanner, rebalance, round_traffic, run_mediator
from fl_aggregators.astraea import Astraea, paper_traffic
from fl_aggregators.astraea_plan import assign_mediators, plan_rebalance


def images(n: int, classes: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([classes[i % len(classes)] for i in range(n)])
    return torch.rand(n, 1, 12, 12, generator=g), y


# -- the aggregator's parameters ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gamma": 0}, "gamma"),
        ({"gamma": 2.5}, "gamma"),
        ({"mediator_epochs": 0}, "mediator_epochs"),
        ({"tau_d": -1.0}, "tau_d"),
        ({"augment": "yes"}, "augment"),
        ({"mediators": 1}, "mediators"),
        ({"carry_optimizer": "yes"}, "carry_optimizer"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Astraea(**kwargs)


def test_mediators_off_means_one_client_per_mediator() -> None:
    assert Astraea(gamma=4).group_size == 4 and Astraea(gamma=4, mediators=False).group_size == 1


def test_traffic_matches_the_papers_model_for_one_mediator_epoch() -> None:
    mediators = [[0, 1, 2], [3, 4, 5], [6, 7]]
    t = round_traffic(1000, mediators, mediator_epochs=1)
    assert sum(t.values()) == paper_traffic(1000, clients=8, gamma=3) == 2 * 1000 * (3 + 8)
    assert round_traffic(1000, mediators, 2)["mediator_clients"] == 2 * 1000 * 2 * 8
    # A client alone is its own mediator: no hop, and mediators off is FedAvg's 2|w| per client.
    alone = round_traffic(1000, [[0], [1], [2]], mediator_epochs=1)
    assert alone == {"server_down": 3000, "server_up": 3000, "mediator_clients": 0}
    assert round_traffic(1000, [[0, 1], [2]], 1)["mediator_clients"] == 2 * 1000 * 2


# -- the client's rebalancing -------------------------------------------------------------------
def test_rebalance_downsamples_and_augments_by_rad_in_expectation() -> None:
    x, y = images(3000, [0, 1, 2])  # 1000 per class
    rad = [0.4, 1.0, 2.5]
    x2, y2 = rebalance(x, y, rad, seed=7)
    counts = np.bincount(y2.numpy(), minlength=3)
    assert counts[1] == 1000  # untouched class: every sample, once
    assert abs(counts[0] - 400) < 4 * np.sqrt(1000 * 0.4 * 0.6)  # binomial(1000, 0.4)
    assert 2000 + 0 <= counts[2] <= 3000 and abs(counts[2] - 2500) < 4 * np.sqrt(1000 * 0.25)
    assert x2.shape[1:] == x.shape[1:] and len(x2) == len(y2)
    # The originals of class 1 are all there, unchanged; the extra class-2 images are new.
    originals = {tuple(v.flatten().tolist()) for v in x[y == 2]}
    new = [v for v in x2[y2 == 2] if tuple(v.flatten().tolist()) not in originals]
    # (a draw of near-zero shift, angle, shear and zoom can reproduce an original exactly
    # under nearest-neighbour interpolation: ~1 % on 12 x 12 images)
    assert 0.95 * (counts[2] - 1000) <= len(new) <= counts[2] - 1000
    assert not torch.equal(y2, torch.sort(y2).values)  # shuffled


def test_rebalance_is_reproducible_from_the_seed() -> None:
    x, y = images(300, [0, 1, 2])
    a, b, c = (rebalance(x, y, [0.5, 1.0, 1.7], seed=s) for s in (3, 3, 4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not (len(a[1]) == len(c[1]) and torch.equal(a[0], c[0]))


def test_rebalance_rejects_labels_outside_the_plan() -> None:
    x, y = images(10, [0, 5])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        rebalance(x, y, [1.0, 1.0, 1.0], seed=0)


def test_rebalance_says_augmentation_needs_images() -> None:
    y = torch.tensor([0, 0, 0, 1])
    with pytest.raises(ValueError, match=r"\(N, C, H, W\).*augment: false"):
        rebalance(torch.rand(4, 64), y, [1.0, 3.0], seed=0)
    x2, _ = rebalance(torch.rand(4, 64), y, [0.5, 1.0], seed=0)  # downsampling only: fine
    assert x2.shape[1] == 64


# -- the mediator ---------------------------------------------------------------------------------
def test_mediator_trains_its_clients_in_order_each_from_the_previous_result() -> None:
    seen: list[tuple[int, str]] = []

    def train_one(client: int, params: str) -> tuple[str, int]:
        seen.append((client, params))
        return params + str(client), 10 * (client + 1)

    result = run_mediator([4, 1, 7], "w", train_one, mediator_epochs=2)
    assert result.trace == [4, 1, 7, 4, 1, 7]
    assert seen[0] == (4, "w") and seen[1] == (1, "w4") and seen[3] == (4, "w417")
    assert result.params == "w417417" and result.num_samples == 50 + 20 + 80


def test_planner_groups_the_sampled_clients_greedily() -> None:
    counts = np.array([[90, 10], [10, 90], [50, 50], [80, 20], [20, 80], [40, 60]])
    planner = AstraeaPlanner(counts, Astraea(gamma=2, augment=False))
    assert planner.rad.tolist() == [1.0, 1.0]
    # Sampled 5, 0, 1, 3. By hand: 5 (40/60) is the most balanced, so it opens the first
    # mediator; with 3 the pool is 120/80, with 0 130/70, with 1 50/150: 3 joins. Then 0
    # (90/10) and 1 (10/90) tie; the lower id goes first, and 1 makes the pool 100/100.
    mediators = planner.mediators([5, 0, 1, 3])
    assert mediators == [[5, 3], [0, 1]]
    kl = planner.mediator_kl(mediators)
    assert kl[1] == pytest.approx(0.0)
    assert kl[0] == pytest.approx(0.6 * np.log(1.2) + 0.4 * np.log(0.8))


def test_planner_schedules_on_expected_counts_after_rebalancing() -> None:
    counts = np.array([[300, 10, 10], [10, 300, 10], [100, 100, 2], [5, 5, 20]])
    planner = AstraeaPlanner(counts, Astraea(gamma=2, tau_d=3.0))
    plan = plan_rebalance(counts, 3.0)
    assert planner.rad.tolist() == plan.rad.tolist() and plan.augment == [2]
    assert np.allclose(planner.expected, counts * plan.rad)
    assert planner.mediators([0, 1, 2, 3]) == [
        [[0, 1, 2, 3][i] for i in g] for g in assign_mediators(counts * plan.rad, 2)
    ]
    kl = planner.client_kl()
    # Class 2 is augmented ~4x: client 2, short of it, gets closer to uniform; client 3,
    # already rich in it, gets further away.
    assert kl["after"][2] < kl["before"][2] and kl["after"][3] > kl["before"][3]


# -- FedLab standalone ----------------------------------------------------------------------------
fedlab = pytest.importorskip("fedlab")


def astraea_config(**overrides: object):  # type: ignore[no-untyped-def]
    partition = {
        "name": "global_imbalance",
        "profile": "zipf",
        "exponent": 1.2,
        "then": {"name": "label_dirichlet", "beta": 0.5},
    }
    defaults = dict(aggregator="astraea", aggregator_args={"gamma": 2, "tau_d": 2.0}, seed=5)
    return digits_run(
        {**defaults, "partition": partition, "num_clients": 8, "clients_per_round": 5, "rounds": 3},
        overrides,
    )


def run_pipeline(cfg):  # type: ignore[no-untyped-def]
    """FedLab's real StandalonePipeline with the Astraea handler and trainer; returns both."""
    from fedlab.core.standalone import StandalonePipeline

    from fl_adapters.fedlab.astraea import AstraeaSerialTrainer, AstraeaServerHandler
    from fl_adapters.fedlab.runner import build, make_handler

    exp = build(cfg)
    per_round: list[list[list[int]]] = []
    handler = make_handler(exp, on_round=lambda h, r: per_round.append(h.round_mediators))
    assert isinstance(handler, AstraeaServerHandler)
    import copy

    trainer = AstraeaSerialTrainer(
        copy.deepcopy(exp.model),
        exp.data,
        exp.local,
        2,
        carry_optimizer=handler.astraea.carry_optimizer,
    )

    class Pipeline(StandalonePipeline):
        def evaluate(self) -> None:
            pass

    Pipeline(handler, trainer).main()
    return handler, trainer, per_round


def test_fedlab_mediators_visit_their_clients_in_order() -> None:
    handler, trainer, per_round = run_pipeline(astraea_config(rounds=2))
    assert len(per_round) == 2
    expected = [
        (r + 1, m, c)
        for r, mediators in enumerate(per_round)
        for m, members in enumerate(mediators)
        for c in members * 2  # mediator_epochs = 2
    ]
    assert trainer.trace == expected
    for mediators in per_round:
        assert sorted(c for g in mediators for c in g) == sorted(
            set(c for g in mediators for c in g)
        )
        assert len(mediators) == 3 and all(len(g) <= 2 for g in mediators)  # 5 clients, gamma 2


def test_fedlab_standalone_astraea_records_mediators_kl_and_bytes(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from fl_adapters.fedlab.runner import run_standalone

    rec = tmp_path / "rec.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(rec))
    summary = run_standalone(astraea_config(), tmp_path / "a", progress=False)
    lines = records(rec)
    assert [r["round"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert r["aggregator"] == "astraea" and r["host"] == "fedlab"
        members = r["mediators"]
        assert len(members) == len(r["clients"]) == len(r["kl"]) == 3
        assert sorted(c for g in members for c in g) == sorted({c for g in members for c in g})
        assert all(k >= 0 for k in r["kl"])
        assert r["weights"] == pytest.approx([n / sum(r["num_samples"]) for n in r["num_samples"]])
        param_bytes = r["bytes"]["server_up"] // 3  # one model up per mediator
        visits = sum(len(g) for g in members if len(g) > 1)  # a lone client is its own mediator
        assert r["bytes"]["mediator_clients"] == 2 * param_bytes * visits
        assert r["bytes"]["server_down"] > r["bytes"]["server_up"]  # plus rad and layout
    astraea = summary["astraea"]
    assert astraea["augment"] and astraea["downsample"]  # zipf: one big class, a long tail
    assert np.mean(astraea["client_kl_after"]) < np.mean(astraea["client_kl_before"])
    assert astraea["mediator_kl_mean"] == pytest.approx(
        np.mean([k for r in lines for k in r["kl"]])
    )
    metrics = records(tmp_path / "a" / "metrics.jsonl")
    assert all(m["bytes_up"] > 0 and len(m["mediators"]) == 3 for m in metrics)

    again = run_standalone(astraea_config(), tmp_path / "b", progress=False)
    assert again["final_accuracy"] == summary["final_accuracy"]
    assert records(tmp_path / "b" / "metrics.jsonl")[-1]["test_loss"] == metrics[-1]["test_loss"]
    assert [r["mediators"] for r in records(rec)[3:]] == [r["mediators"] for r in lines]


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        (("simulation", "MPI"), {"mediator_epochs": 2}, "mediator_epochs must be 1 in FedML"),
        (("cross_silo", "MPI"), {"mediator_epochs": 2}, "mediator_epochs must be 1 in FedML"),
        (("simulation", "sp"), {"carry_optimizer": True}, "ModelTrainer's own optimizer"),
        (("cross_silo", "MPI"), {"carry_optimizer": True}, "carry_optimizer: true cannot take"),
    ],
)
def test_fedml_modes_refuse_astraea_settings_they_cannot_run(
    mode: tuple[str, str], extra: dict[str, int], message: str
) -> None:
    pytest.importorskip("fedml")
    from types import SimpleNamespace

    from fl_adapters.fedml.adapter import validate

    args = SimpleNamespace(
        aggregator="astraea",
        aggregator_args=extra,
        training_type=mode[0],
        backend=mode[1],
        comm=SimpleNamespace(Get_size=lambda: 3),
        client_num_per_round=2,
        worker_num=2,
    )
    with pytest.raises(ValueError, match=message):
        validate(args)


@pytest.mark.slow
def test_astraea_bench_quick_writes_its_tables_records_and_plot(tmp_path: Path) -> None:
    from fedbalance_benchmarks import astraea as bench

    argv = ["--quick", "--out", str(tmp_path), "--variants", "fedavg", "mediators only"]
    assert bench.main(argv) == 0
    md = next(tmp_path.glob("astraea_*_quick.md")).read_text()
    rows = [line for line in md.splitlines() if line.startswith(("| fedavg", "| mediators only"))]
    # fedavg: its accuracy row; mediators only: accuracy, rebalancing and paper rows; both:
    # a row in the bias figures, the per-class recall and the fall tables.
    assert len(rows) == 4 + 3 * 2 and "Regenerate: `fedbalance bench astraea --quick" in md
    bias = md.split("## Measured on its purpose", 1)[1].split("## Why the mediators fall")[0]
    figures = [x for x in bias.splitlines() if x.startswith(("| fedavg", "| mediators only"))]
    # recorded: balanced accuracy and worst class on every row (no variant here augments, so
    # no minority classes are named)
    assert len(figures) == 4 and all(x.split("|")[2].strip() != "-" for x in figures)
    assert "| fedavg         | 4 x E5 " in md and "| mediators only | 10 x E1 x Em2 " in md
    records = sorted((tmp_path / "per-run").rglob("seed0.json"))
    assert [p.parent.name for p in records] == ["fedavg", "mediators_only"]
    fedavg, mediators = (json.loads(p.read_text()) for p in records)
    assert len(fedavg["accuracy"]) == len(mediators["accuracy"]) == 5
    # The paper's design: FedAvg 4 clients x 5 epochs, mediators 10 clients x 1 epoch x Em 2.
    assert fedavg["config"]["clients_per_round"] == 4 and fedavg["config"]["local_epochs"] == 5
    assert mediators["config"]["aggregator_args"]["mediator_epochs"] == 2
    assert all(n > 0 for n in fedavg["sample_passes"] + mediators["sample_passes"])
    assert fedavg["config"]["aggregator_args"]["sample_clip"] is None
    # Each arm at the optimizer and rate the committed validation sweep chose for it.
    chosen = bench.chosen_settings("fmnist", "letters")
    for rec, arm in ((fedavg, "fedavg"), (mediators, "astraea")):
        assert (rec["config"]["optimizer"], rec["config"]["lr"]) == chosen[arm]
        assert len(rec["balanced_accuracy"]) == len(rec["class_recall"]) == 5
    assert next(tmp_path.glob("astraea_*_quick_accuracy.png")).stat().st_size > 0


def test_astraea_bench_never_falls_back_to_an_untuned_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedbalance_benchmarks import astraea as bench

    with pytest.raises(SystemExit, match="run `fedbalance bench astraea-sweep --dataset fmnist"):
        bench.chosen_settings("fmnist", "half_normal")  # no sweep of that profile is committed
    opts = {"dataset": "fmnist", "profile": "letters", "quick": False}
    assert bench.stem_of(opts) == "astraea_fmnist_letters"
    assert bench.stem_of({**opts, "fixed_setting": ("adam", 1e-3)}) == (
        "astraea_fmnist_letters_adam_lr0.001"
    )
    with pytest.raises(SystemExit):
        bench.main(["--setting", "rmsprop:0.1"])
    assert "OPTIMIZER one of" in capsys.readouterr().err


@pytest.mark.slow
def test_astraea_bench_measures_traffic_and_resumes_from_its_records(tmp_path: Path) -> None:
    from fedbalance_benchmarks import astraea as bench

    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["--quick", "--rounds", "2", "--out", str(out), "--runs-dir", str(runs)]
    argv += ["--variants", "fedavg", "astraea"]
    assert bench.main([*argv, "--frameworks", "fedlab", "fedlab-distributed"]) == 0
    md = next(out.glob("astraea_*_quick.md")).read_text()
    assert "## Traffic actually sent" in md and "| astraea | fedlab-distributed |" in md
    sent = {
        tuple(cell.strip() for cell in line.split("|")[1:3]): float(line.split("|")[5])
        for line in md.splitlines()
        if line.startswith(("| fedavg ", "| astraea "))
        and ("fedlab " in line or "fedlab-distributed" in line)
        and line.count("|") == 6
    }
    for v in bench.MODE_VARIANTS:  # on the wire: one downlink per process, co-located
        # members of a mediator in a row, so at most the per-client count of the paper's model
        assert 0 < sent[(v, "fedlab-distributed")] <= sent[(v, "fedlab")], (v, sent)
    # Another machine: no run directories, only the committed records. Nothing reruns.
    main_rows = [x for x in md.splitlines() if x.startswith(("| fedavg ", "| astraea "))][:2]
    shutil.rmtree(runs)
    assert bench.main(argv) == 0
    again = next(out.glob("astraea_*_quick.md")).read_text()
    assert [x for x in again.splitlines() if x.startswith(("| fedavg ", "| astraea "))][:2] == (
        main_rows
    )
    assert not runs.exists() or not any(runs.rglob("summary.json"))


def test_planner_bounds_a_mediators_sample_count_by_its_members_data() -> None:
    from fl_aggregators.astraea import Astraea

    counts = np.array([[30] * 9 + [1], [20] * 9 + [2], [10] * 9 + [1]])
    plain = AstraeaPlanner(counts, Astraea(augment=False))
    assert plain.bound_samples([0, 2], 362) == 362  # honest: exactly the counts
    assert plain.bound_samples([0, 2], 10**6) == 362
    planner = AstraeaPlanner(counts, Astraea(tau_d=1.0))
    assert planner.rad[9] > 6  # the minority class is augmented: ~6.3 copies per sample
    most = 9 * 20 + 2 * 7  # each sample of class 9 kept at most ceil(6.3) = 7 times
    assert planner.bound_samples([1], most) == most
    assert planner.bound_samples([1], most + 1) == most


def test_a_relay_hop_applies_the_uplink_hook_to_every_member() -> None:
    """Cross-process Astraea trains a hop's members in one process; each member's report goes
    through ``uplink_hook`` as in standalone, so attacks and faults run there too."""
    import copy

    from fl_adapters.fedlab.astraea import AstraeaSerialTrainer, encode_hop
    from fl_adapters.fedlab.runner import build

    exp = build(astraea_config(rounds=1))
    seen: list[int] = []

    def zero_update(client: int, received: torch.Tensor, package: list) -> list:  # type: ignore[type-arg]
        seen.append(client)
        return [torch.zeros_like(package[0]), package[1]]  # this member sends a zero model

    trainer = AstraeaSerialTrainer(
        copy.deepcopy(exp.model), exp.data, exp.local, client_ids=[3, 5], uplink_hook=zero_update
    )
    params = torch.ones(sum(p.numel() for p in exp.model.parameters()))
    rad = torch.ones(10)  # digits: ten classes, none rebalanced
    trainer.local_process([params, rad, encode_hop(0, [3, 5])], [0, 1])
    assert seen == [3, 5]  # both members, in chain order
    uploaded = trainer.uplink_package[0][0]
    assert torch.count_nonzero(uploaded) == 0  # the last member's hooked report is what is sent


# -- carry_optimizer: one optimizer along each mediator's chain ---------------------------------
def test_local_train_continues_the_optimizer_it_is_given() -> None:
    from torch.utils.data import TensorDataset

    from fl_adapters._training import local_train

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g))

    def two_members(carry: dict | None) -> torch.Tensor:  # type: ignore[type-arg]
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 3)
        for seed in (0, 1):  # two members of a chain, 3 batches of 16 each
            local_train(
                model, data, epochs=1, batch_size=16, optimizer="adam", lr=1e-2, seed=seed,
                carry=carry,
            )  # fmt: skip
        return model.weight.detach().clone()

    carry: dict = {}  # type: ignore[type-arg]
    carried, fresh = two_members(carry), two_members(None)
    steps = {int(s["step"]) for s in carry["state"]["state"].values()}
    assert steps == {6}  # both members' batches stepped one Adam
    assert not torch.equal(carried, fresh)
    assert torch.equal(carried, two_members({}))  # the same seeds, the same model


def test_fedlab_standalone_carries_one_optimizer_per_mediator_and_round(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fl_adapters.fedlab.trainer as trainer_module

    calls: list[tuple[int, int]] = []  # (id of the carried state, Adam steps it held before)
    real = trainer_module.local_train

    def counted(*a, carry=None, **kw):  # type: ignore[no-untyped-def]
        assert carry is not None
        before = carry.get("state", {}).get("state", {}).get(0, {}).get("step", 0)
        calls.append((id(carry), int(before)))
        return real(*a, carry=carry, **kw)

    monkeypatch.setattr(trainer_module, "local_train", counted)
    args = {"gamma": 2, "tau_d": 2.0, "carry_optimizer": True}
    handler, trainer, per_round = run_pipeline(astraea_config(rounds=2, aggregator_args=args))
    assert trainer.carry_optimizer
    assert len(calls) == len(trainer.trace) == sum(2 * len(g) for r in per_round for g in r)
    chains: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (rnd, m, _), call in zip(trainer.trace, calls, strict=True):
        chains.setdefault((rnd, m), []).append(call)
    assert len(chains) == sum(len(r) for r in per_round)
    for chain in chains.values():
        assert len({i for i, _ in chain}) == 1  # one optimizer along the chain
        assert chain[0][1] == 0  # fresh at the chain's start: each mediator, each round
        steps = [b for _, b in chain]
        assert steps == sorted(set(steps))  # its steps accumulate along the chain


def test_carried_and_fresh_optimizers_train_different_models() -> None:
    args = {"gamma": 2, "tau_d": 2.0}
    models = []
    for carry in (False, True, True):
        cfg = astraea_config(rounds=1, aggregator_args={**args, "carry_optimizer": carry})
        handler, _, _ = run_pipeline(cfg)
        models.append(handler.model_parameters.clone())
    assert not torch.equal(models[0], models[1])
    assert torch.equal(models[1], models[2])  # reproducible from the seed


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"framework": "fedlab-distributed"},
            "cannot take effect in framework: fedlab-distributed",
        ),
        ({"framework": "fedml-sp", "eval_data": "clients"}, "framework: fedml-sp"),
        ({"framework": "fedml-mpi", "eval_data": "clients"}, "framework: fedml-mpi"),
        ({"framework": "flower", "eval_data": "clients"}, "framework: flower"),
        ({"framework": "flower-deployment", "eval_data": "clients"}, "flower-deployment"),
        ({"optimizer": "sgd"}, "optimizer: sgd .no momentum. has none"),
    ],
)
def test_a_config_asking_for_a_carried_optimizer_where_it_cannot_take_effect_stops(
    overrides: dict,
    message: str,  # type: ignore[type-arg]
) -> None:
    from fl_adapters.config import ConfigError

    args = {"gamma": 2, "carry_optimizer": True}
    with pytest.raises(ConfigError, match=message) as e:
        astraea_config(aggregator_args=args, **overrides)
    assert "carry_optimizer" in str(e.value)
    assert astraea_config(aggregator_args=args).aggregator_args == args  # FedLab standalone runs


def test_an_armed_fedlab_script_refuses_a_carried_optimizer() -> None:
    from fl_adapters.fedlab.patches import ENV_ARGS, FedLabArming

    with pytest.raises(ValueError, match=f"{ENV_ARGS}: carry_optimizer: true cannot take effect"):
        FedLabArming("astraea", {"carry_optimizer": True})
    FedLabArming("astraea", {"carry_optimizer": False})


def test_a_relay_hop_refuses_a_carried_optimizer() -> None:
    import copy

    from fl_adapters.fedlab.astraea import AstraeaSerialTrainer, encode_hop
    from fl_adapters.fedlab.runner import build

    exp = build(astraea_config(rounds=1))
    trainer = AstraeaSerialTrainer(
        copy.deepcopy(exp.model), exp.data, exp.local, client_ids=[3, 5], carry_optimizer=True
    )
    params = torch.ones(sum(p.numel() for p in exp.model.parameters()))
    with pytest.raises(ValueError, match="carry_optimizer: a relay hop of mediator 0"):
        trainer.local_process([params, torch.ones(10), encode_hop(0, [3, 5])], [0, 1])
    assert trainer.trace == []  # refused before training
