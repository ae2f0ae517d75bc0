"""Astraea's planning: z-scores and Rad by hand, the stated range, greedy mediators by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_adapters.cli import main
from fl_aggregators import _kl_screen
from fl_aggregators.astraea_plan import (
    SCREEN_MIN_CLIENTS,
    _assign_mediators_reference,
    _assign_mediators_screened,
    _kl_uniform,
    assign_mediators,
    clip_counts,
    mediator_kl,
    plan_rebalance,
)


def test_plan_by_hand() -> None:
    # C = [1000, 100 x 9]: mu = 190, deviations 810 and -90 -> sigma = sqrt(72900) = 270,
    # Z = [3, -1/3 x 9].
    plan = plan_rebalance([1000] + [100] * 9, tau_d=2.5)
    assert plan.mu == 190 and plan.sigma == 270
    assert plan.z.tolist() == pytest.approx([3.0] + [-1 / 3] * 9)
    assert plan.downsample == [0] and plan.augment == []  # -1/3 is above tau_a = -0.4
    assert plan.rad[0] == pytest.approx((190 + 270 * math.sqrt(3 * 2.5)) / 1000)  # 0.92942...
    assert plan.rad[1:].tolist() == [1.0] * 9


def test_minority_augmentation_by_hand() -> None:
    # C = [10, 100, 100, 100]: mu = 77.5, sigma = sqrt((67.5^2 + 3 * 22.5^2) / 4) = 38.971...
    sizes = np.array([10.0, 100, 100, 100])
    mu, sigma = 77.5, float(np.sqrt((67.5**2 + 3 * 22.5**2) / 4))
    plan = plan_rebalance(sizes, tau_d=1.0)  # tau_a = -1
    z0 = (10 - mu) / sigma  # -1.732
    assert plan.augment == [0] and plan.downsample == []
    assert plan.rad[0] == pytest.approx((mu - sigma * math.sqrt(z0 * -1.0)) / 10)
    assert plan.rad[0] > 1


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 100_000), min_size=2, max_size=30), tau_d=st.floats(0.2, 4.0))
def test_rescaled_sizes_fall_in_the_papers_stated_ranges(sizes: list[int], tau_d: float) -> None:
    plan = plan_rebalance(sizes, tau_d)
    c = np.asarray(sizes, dtype=float)
    after = c * plan.rad
    tau_a = -1 / tau_d
    for y in plan.augment:  # expected size in (C_y, sigma * tau_a + mu)
        assert c[y] < after[y] <= plan.sigma * tau_a + plan.mu + 1e-9
    for y in plan.downsample:  # mirrored: in (mu + sigma * tau_d, C_y)
        assert plan.mu + plan.sigma * tau_d - 1e-9 <= after[y] < c[y]
    untouched = set(range(len(sizes))) - set(plan.augment) - set(plan.downsample)
    assert all(plan.rad[y] == 1 for y in untouched)


def test_balanced_data_is_left_alone() -> None:
    plan = plan_rebalance([50, 50, 50])
    assert (
        plan.sigma == 0 and plan.rad.tolist() == [1, 1, 1] and plan.augment == plan.downsample == []
    )


COUNTS = [[10, 0, 0], [0, 10, 0], [0, 0, 10], [5, 5, 0], [0, 0, 5]]


def test_greedy_mediators_by_hand() -> None:
    # Mediator 1 starts with the client closest to uniform: client 3 (KL log 1.5 < log 3).
    # Adding client 4 gives [5, 5, 5] (KL 0) -> [3, 4]. Then clients 0, 1, 2 tie at log 3:
    # lowest id 0; with 0, clients 1 and 2 tie at log 1.5: lowest id 1 -> [0, 1], then [2].
    assert assign_mediators(COUNTS, gamma=2) == [[3, 4], [0, 1], [2]]
    assert mediator_kl(COUNTS, [[3, 4], [0, 1], [2]]) == pytest.approx(
        [0.0, math.log(1.5), math.log(3)]
    )
    assert assign_mediators(COUNTS, gamma=5) == [[3, 4, 0, 1, 2]]
    # One client each: client 3 first (closest to uniform), then the single-class ties by id.
    assert assign_mediators(COUNTS, gamma=1) == [[3], [0], [1], [2], [4]]


def test_mediators_reduce_kl_on_skewed_clients() -> None:
    rng = np.random.default_rng(0)
    counts = np.zeros((40, 10))
    for i in range(40):  # two classes per client
        counts[i, rng.choice(10, 2, replace=False)] = rng.integers(20, 200, 2)
    mediators = assign_mediators(counts, gamma=8)
    client_kl = np.mean([mediator_kl(counts, [[i]])[0] for i in range(40)])
    assert sorted(c for m in mediators for c in m) == list(range(40))
    assert np.mean(mediator_kl(counts, mediators)) < 0.25 * client_kl
    assert assign_mediators(counts, 8) == mediators  # deterministic


def label_skew(n: int, classes: int, beta: float, seed: int) -> np.ndarray:
    """Integer label counts: client sizes 20..600, class shares drawn from Dirichlet(beta)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 601, n)
    shares = rng.dirichlet(np.full(classes, beta), n)
    return np.stack([rng.multinomial(s, p) for s, p in zip(sizes, shares, strict=True)]) * 1.0


def near_ties(n: int, classes: int, seed: int) -> np.ndarray:
    """Rows that are column permutations and multiples of a few rows: their KL to uniform is
    equal in exact arithmetic and differs in the last bits in numpy's (after rounding to 12
    decimals, some tie and some do not), and duplicates, all-equal and zero rows among them."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 30, (3, classes)) * rng.choice([1.0, 0.1, 1.37], (3, 1))
    rows = [rng.permutation(base[rng.integers(3)]) * rng.choice([1, 2, 3, 7]) for _ in range(n)]
    counts = np.array(rows)
    counts[rng.random(n) < 0.1] = 0
    counts[rng.random(n) < 0.1] = 5.0
    return counts


# (counts, gamma): integer and float counts, gamma 1 (every pick is a mediator's first),
# gamma beyond n (one mediator), 2 and 3 classes (many ties), and the near-ties above.
SCREEN_CASES = {
    "beta-0.5": (label_skew(300, 47, 0.5, 0), 10),
    "beta-0.1": (label_skew(300, 47, 0.1, 1), 7),
    "float-x1.37": (label_skew(250, 10, 0.5, 2) * 1.37, 5),
    "per-class-factor": (
        label_skew(250, 10, 0.3, 3) * np.random.default_rng(3).uniform(0.2, 3, 10),
        4,
    ),
    "non-integer": (np.random.default_rng(4).uniform(0, 5, (200, 6)) ** 3, 9),
    "gamma-1": (label_skew(200, 10, 0.5, 5), 1),
    "gamma-2": (label_skew(200, 47, 0.1, 6), 2),
    "gamma-above-n": (label_skew(120, 10, 0.5, 7), 500),
    "two-classes": (np.random.default_rng(8).integers(0, 4, (200, 2)) * 1.0, 6),
    "three-classes": (np.random.default_rng(9).integers(0, 3, (150, 3)) * 0.5, 4),
    "near-ties": (near_ties(200, 8, 10), 5),
    "near-ties-2": (near_ties(200, 4, 11), 3),
    "all-equal": (np.full((100, 5), 3.0), 8),
    "all-zero": (np.zeros((90, 4)), 7),
    "zero-rows": (np.where(np.arange(150)[:, None] % 3 == 0, 0, label_skew(150, 12, 0.5, 12)), 6),
    "tiny-values": (label_skew(150, 10, 0.5, 13) * 1e-200, 5),
    "huge-values": (label_skew(150, 10, 0.5, 14) * 1e200, 5),
}


@pytest.mark.parametrize("case", list(SCREEN_CASES), ids=list(SCREEN_CASES))
def test_screened_mediators_are_numpys(case: str) -> None:
    """The compiled screen only narrows each pick to ids that may win; numpy's expression
    decides among them, so the assignment is the numpy loop's, list for list."""
    counts, gamma = SCREEN_CASES[case]
    assert _kl_screen.scale(counts) is not None  # the screen runs on every case
    assert _assign_mediators_screened(counts, gamma) == _assign_mediators_reference(counts, gamma)


@pytest.mark.parametrize(
    "counts",
    [
        np.vstack([label_skew(100, 5, 0.5, 15), [[1e-40, 0, 0, 0, 0]]]),  # 2^100 below the total
        label_skew(100, 5, 0.5, 16) * 1e290,  # total above 2^900
        np.full((100, 3), 1e-300),  # total below 2^-900
    ],
    ids=["wide-range", "huge-total", "tiny-total"],
)
def test_counts_outside_the_screens_bounds_take_the_numpy_loop(counts: np.ndarray) -> None:
    assert _kl_screen.scale(counts) is None
    assert assign_mediators(counts, 4) == _assign_mediators_reference(counts, 4)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, 1.37, 10.0]), min_size=3, max_size=3),
        min_size=1,
        max_size=40,
    ),
    gamma=st.integers(1, 45),
)
def test_screened_mediators_are_numpys_on_small_alphabets(
    rows: list[list[float]], gamma: int
) -> None:
    # Few distinct values: duplicated rows, permuted rows and exact ties everywhere.
    counts = np.array(rows)
    assert _assign_mediators_screened(counts, gamma) == _assign_mediators_reference(counts, gamma)


def test_assign_mediators_screens_from_the_threshold_on(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = label_skew(SCREEN_MIN_CLIENTS, 10, 0.5, 17)
    calls: list[int] = []
    screened = _assign_mediators_screened

    def spy(arr: np.ndarray, gamma: int) -> list[list[int]]:
        calls.append(len(arr))
        return screened(arr, gamma)

    monkeypatch.setattr("fl_aggregators.astraea_plan._assign_mediators_screened", spy)
    expected = _assign_mediators_reference(counts, 5)
    assert assign_mediators(counts, 5) == expected and calls == [SCREEN_MIN_CLIENTS]
    assert assign_mediators(counts[:-1], 5) == _assign_mediators_reference(counts[:-1], 5)
    monkeypatch.setenv("FEDBALANCE_KERNELS", "0")  # the documented switch: numpy alone
    assert assign_mediators(counts, 5) == expected and calls == [SCREEN_MIN_CLIENTS]


@pytest.mark.parametrize("classes", [2, 3, 8, 9, 47, 130])
def test_numpys_kl_of_a_row_does_not_depend_on_the_rows_beside_it(classes: int) -> None:
    # What the screen's identity rests on: numpy's value of a row, computed among all the
    # candidates, is the one it has alone, among a few, or among its duplicates.
    rows = label_skew(700, classes, 0.3, classes) * 1.37
    together = _kl_uniform(rows)
    for i in (0, 1, 7, 350, 699):
        assert _kl_uniform(rows[i : i + 1])[0] == together[i]
        assert _kl_uniform(rows[i : i + 3])[0] == together[i]
        assert np.all(_kl_uniform(np.repeat(rows[i : i + 1], 9, axis=0)) == together[i])


@pytest.mark.parametrize("classes", [2, 10, 47])
def test_screen_values_stay_within_their_proven_bounds(classes: int) -> None:
    """The error bounds the short lists rest on, against numpy's values: both stages' values,
    for pools of 0 to 20 clients."""
    counts = label_skew(400, classes, 0.3, classes) * np.random.default_rng(0).uniform(
        0.5, 2, classes
    )
    screen = _kl_screen.Screen(counts, _kl_screen.scale(counts))  # type: ignore[arg-type]
    bound32 = _kl_screen.screen_error(classes) + _kl_screen.numpy_error(classes)
    worst32 = worst64 = 0.0
    for members in (0, 1, 2, 5, 20):
        pool = counts[:members].sum(axis=0)
        screen.shortlist(pool)
        ids = screen.lane_id[: screen.m]
        numpy_kl = _kl_uniform(pool + counts[ids])
        worst32 = max(worst32, float(np.max(np.abs(screen.f[: screen.m] - numpy_kl))))
        kl64 = [_kl_screen._kl64(pool, counts[i]) for i in ids]
        worst64 = max(worst64, float(np.max(np.abs(np.array(kl64) - numpy_kl))))
    assert worst32 <= bound32 / 4  # the bounds are doubled: a slack of 4 still holds
    assert worst64 <= _kl_screen.numpy_error(classes)


def test_one_clients_count_lie_is_bounded() -> None:
    # 60 honest clients with 30 samples of each of 10 classes but only 3 of class 9: the plan
    # augments class 9. A liar claiming 1000x class 9 hides it from augmentation under the
    # paper's plain sum; bounded at 20x the others' mean it adds at most 20/60 of class 9.
    honest = np.full((60, 10), 30.0)
    honest[:, 9] = 3
    liar = honest[:1].copy()
    liar[0, 9] *= 1000
    counts = np.vstack([honest, liar])
    clean = plan_rebalance(honest, 3.0)
    assert clean.augment == [9] and clean.downsample == []
    paper = plan_rebalance(counts, 3.0, count_clip=None)
    assert paper.augment == []  # the minority class is hidden
    bounded = plan_rebalance(counts, 3.0)
    assert bounded.augment == [9] and bounded.downsample == []
    assert bounded.rad[9] == pytest.approx(clean.rad[9] * 180 / 240, rel=0.15)
    clipped = clip_counts(counts, 20.0)
    assert np.array_equal(clipped[:60], honest)  # honest rows untouched
    assert clipped[60, 9] == pytest.approx(20 * 3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_rebalance([1, 2], tau_d=0), "tau_d must be a finite float in [0.01, 100]"),
        (
            lambda: plan_rebalance([[1, 2], [3, 4]], count_clip=0.5),
            "count_clip must be None or a finite float in [1, 1000], got 0.5",
        ),
        (lambda: plan_rebalance([1, -2]), "class sizes must be >= 2 non-negative finite numbers"),
        (
            lambda: assign_mediators(COUNTS, gamma=0),
            "gamma must be an int >= 1 (clients per mediator), got 0",
        ),
        (lambda: assign_mediators([[1, 2], [3]], gamma=2), "clients x classes matrix"),
        (lambda: assign_mediators([[1]] * 100, gamma=2), "with >= 2 classes, got shape (100, 1)"),
    ],
    ids=["tau-d", "count-clip", "negative-size", "gamma", "ragged", "one-class"],
)
def test_bad_input_is_a_clear_error(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_cli_plan_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "counts.json"
    f.write_text(json.dumps([[900, 10, 5], [800, 20, 0], [50, 60, 70], [10, 40, 300]]))
    assert (
        main(["astraea", "plan", "--class-counts", str(f), "--tau-d", "0.5", "--gamma", "2"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert {"z", "augment", "downsample", "rad", "mediators", "kl"} <= set(doc)
    assert len(doc["z"]) == 3 and len(doc["rad"]) == 3 and len(doc["kl"]) == len(doc["mediators"])
    assert sorted(c for m in doc["mediators"] for c in m) == [0, 1, 2, 3]
    assert doc["downsample"] == [0] and doc["rad"][0] < 1


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_cli_plan_previews_the_clients_fedlab_samples_in_round_1(
    tmp_path: Path, capsys, seed: int
) -> None:  # type: ignore[no-untyped-def]
    """The preview used numpy's generator while the hosts draw with random.Random: it never
    showed round 1's mediators. Now its clients are FedLab's handler's first sample."""
    from fl_adapters.fedlab.handler import FedBalanceServerHandler

    counts = [[50 + 7 * i, 40, 10 + 3 * i] for i in range(12)]
    f = tmp_path / "counts.json"
    f.write_text(json.dumps(counts))
    argv = ["astraea", "plan", "--class-counts", str(f), "--clients-per-round", "5"]
    assert main([*argv, "--seed", str(seed), "--gamma", "5"]) == 0
    previewed = sorted(c for m in json.loads(capsys.readouterr().out)["mediators"] for c in m)
    handler = FedBalanceServerHandler(torch.nn.Linear(2, 2), 1, 1.0, clients_per_round=5, seed=seed)
    handler.num_clients = 12  # what FedLab's network manager sets from the clients' count
    assert previewed == handler.sample_clients()


def test_cli_plan_rejects_bad_values(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "counts.json"
    f.write_text("[[1, 2], [3, -4]]")
    assert main(["astraea", "plan", "--class-counts", str(f)]) == 2
    assert "--class-counts must be finite and >= 0" in capsys.readouterr().err
    f.write_text("[[1, 2]]")
    assert main(["astraea", "plan", "--class-counts", str(f), "--tau-d", "0"]) == 2
    assert "tau_d must be a finite float in [0.01, 100]" in capsys.readouterr().err


def test_the_papers_printed_augmentation_formula_on_request() -> None:
    """``rule="paper"``: ``Rad = (mu + sigma sqrt(|Z| tau_d)) / C`` for every rescaled class,
    the downsampling formula with |Z|; it takes a minority class above the mean, where the
    bounded default stays below it. Downsampling is the same under both."""
    sizes = np.array([4000, 900, 1500, 2500, 300, 2000, 1800, 700, 3500, 200], dtype=float)
    mu, sigma = sizes.mean(), sizes.std()
    bounded = plan_rebalance(sizes, tau_d=1.0)
    paper = plan_rebalance(sizes, tau_d=1.0, rule="paper")
    assert paper.augment == bounded.augment and paper.downsample == bounded.downsample
    assert paper.augment and paper.downsample
    for y in paper.augment:
        z = (sizes[y] - mu) / sigma
        assert paper.rad[y] == pytest.approx((mu + sigma * math.sqrt(abs(z) * 1.0)) / sizes[y])
        assert paper.rad[y] * sizes[y] > mu > bounded.rad[y] * sizes[y]
    for y in paper.downsample:
        assert paper.rad[y] == bounded.rad[y]
    assert paper.as_dict()["rule"] == "paper" and "rule" not in bounded.as_dict()
    with pytest.raises(ValueError, match="rule must be one of bounded, paper, got 'literal'"):
        plan_rebalance(sizes, rule="literal")


@pytest.mark.parametrize("value", ["Paper", 1, None])
def test_augment_takes_true_false_or_paper(value: object) -> None:
    from fl_aggregators.astraea import Astraea

    assert Astraea(augment="paper").augment_rule == "paper" and Astraea().augment_rule == "bounded"
    with pytest.raises(ValueError, match="augment must be true .* 'paper' .* or false"):
        Astraea(augment=value)  # type: ignore[arg-type]


def test_cli_plan_of_a_run_config_is_that_runs_round_1(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`astraea plan --config` previews exactly round 1 of `fedbalance run` on the same config:
    the hosts' sampler, the run's partition and plan. The run's first row also counts the
    samples its mediators trained on (Em passes over rebalanced data) and their KL as trained."""
    import yaml

    from fl_adapters.astraea import rebalance_client
    from fl_adapters.config import RunConfig
    from fl_adapters.datasets import load_dataset
    from fl_adapters.experiment import training_data

    config = {
        "framework": "fedlab",
        "dataset": "digits",
        "partition": {"name": "label_dirichlet", "beta": 0.3},
        "aggregator": "astraea",
        "aggregator_args": {"gamma": 3, "tau_d": 1.0, "mediator_epochs": 2},
        "num_clients": 16,
        "clients_per_round": 9,
        "rounds": 1,
        "local_epochs": 1,
        "seed": 5,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["astraea", "plan", "--config", str(path)]) == 0
    preview = json.loads(capsys.readouterr().out)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert preview["mediators"] == row["mediators"] and len(row["mediators"]) == 3
    assert preview["kl"] == pytest.approx(row["mediator_kl"])
    assert preview["augment"], preview  # rebalancing ran: the sizes below are not the raw ones
    # Samples trained: each member's rebalanced training data, twice (mediator_epochs 2).
    _, labels, partition = training_data(RunConfig.from_dict(config))
    data = load_dataset("digits")
    sizes = []
    for c in preview["clients"]:
        idx = partition.splits[c]["train"]
        x, y = data.get_batch(idx)
        sizes.append(len(rebalance_client(x, y, preview["rad"], 5, c)[1]))
    assert row["sample_passes"] == 2 * sum(sizes)
    assert len(row["mediator_kl_trained"]) == 3
    summary = json.loads((out / "summary.json").read_text())["astraea"]
    assert sorted(int(c) for c in summary["client_kl_after_trained"]) == preview["clients"]
    assert summary["data_added"]["trained"] == pytest.approx(
        sum(sizes) / sum(len(partition.splits[c]["train"]) for c in preview["clients"]) - 1
    )
