"""The bias figures (fl_adapters.bias): per-class and per-client, from counts that add up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_adapters.bias import Counts, class_figures, client_accuracies, client_figures, total


def counts(total_: list[int], correct: list[int], loss: float = 0.0) -> Counts:
    return Counts(loss, np.array(total_, np.int64), np.array(correct, np.int64))


def test_class_figures_are_consistent_and_name_absent_classes_null() -> None:
    c = counts([10, 0, 4, 6], [9, 0, 1, 6])
    got = class_figures(c, num_classes=5)
    assert got["class_recall"] == [0.9, None, 0.25, 1.0, None]
    assert got["balanced_accuracy"] == pytest.approx((0.9 + 0.25 + 1.0) / 3)
    assert (got["worst_class"], got["worst_class_recall"]) == (2, 0.25)
    assert c.accuracy == pytest.approx(16 / 20) and c.n == 20
    tie = class_figures(counts([2, 2], [1, 1]))
    assert tie["worst_class"] == 0  # the lowest index on a tie
    nothing = class_figures(Counts())
    assert nothing["balanced_accuracy"] is None and nothing["worst_class"] is None


def test_counts_add_over_clients_with_different_class_counts() -> None:
    a, b = counts([3, 1], [2, 1], loss=1.5), counts([0, 2, 5], [0, 1, 4], loss=2.5)
    s = total([a, b])
    assert s.total.tolist() == [3, 3, 5] and s.correct.tolist() == [2, 2, 4]
    assert s.loss == pytest.approx(4.0 / 11)
    assert math.isnan(Counts().accuracy) and math.isnan(Counts().loss)


def test_client_figures_summarise_the_clients_with_samples() -> None:
    per = {0: counts([4], [4]), 1: counts([4], [2]), 2: counts([4], [1]), 3: Counts()}
    got = client_figures(per)
    accs = np.array([1.0, 0.5, 0.25])
    assert got["client_acc_mean"] == pytest.approx(accs.mean())
    assert got["client_acc_std"] == pytest.approx(accs.std(ddof=1))
    assert got["client_acc_min"] == 0.25 and got["clients_evaluated"] == 3
    assert got["client_acc_p10"] == pytest.approx(0.3) and got["client_acc_p90"] == pytest.approx(
        0.9
    )
    assert client_accuracies(per) == {"0": 1.0, "1": 0.5, "2": 0.25, "3": None}
    one = client_figures({5: counts([2], [1])})
    assert one["client_acc_std"] is None and one["client_acc_mean"] == 0.5
    assert client_figures({1: Counts()})["client_acc_mean"] is None


def test_figures_of_a_model_on_clients_loaders() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from fl_adapters.bias import figures

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    x, y = torch.randn(30, 3), torch.randint(0, 3, (30,))
    loaders = {0: DataLoader(TensorDataset(x[:20], y[:20]), batch_size=7),
               1: DataLoader(TensorDataset(x[20:], y[20:]), batch_size=7)}  # fmt: skip
    got = figures(model, loaders, num_classes=4)
    pred = model(x).argmax(dim=1)
    assert got["samples"] == 30 and got["accuracy"] == pytest.approx(
        float((pred == y).float().mean())
    )
    assert got["class_recall"][3] is None and got["clients_evaluated"] == 2
    first = float((pred[:20] == y[:20]).float().mean())
    assert got["client_accuracy"]["0"] == pytest.approx(first)
    assert figures(model, TensorDataset(x, y))["accuracy"] == got["accuracy"]


def test_counts_in_parts_of_one_pass_equal_each_parts_own_pass() -> None:
    """``evaluate_counts_in_parts`` over a concatenation, its batches crossing the parts'
    boundaries and one part empty, counts what each part's own pass counts."""
    import torch
    from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

    from fl_adapters._training import evaluate_counts, evaluate_counts_in_parts

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    parts = [TensorDataset(torch.randn(n, 4), torch.randint(0, 3, (n,))) for n in (7, 0, 12, 5)]
    joined = DataLoader(ConcatDataset(parts), batch_size=5)
    got = evaluate_counts_in_parts(model, joined, [len(p) for p in parts])
    for mine, part in zip(got, parts, strict=True):
        want = evaluate_counts(model, part) if len(part) else Counts()
        three = [np.pad(v, (0, 3 - len(v))).tolist() for v in (mine.total, want.total)]
        assert three[0] == three[1]
        three = [np.pad(v, (0, 3 - len(v))).tolist() for v in (mine.correct, want.correct)]
        assert three[0] == three[1]
        assert mine.loss_sum == pytest.approx(want.loss_sum, rel=1e-6)
    with pytest.raises(ValueError, match="parts' sizes"):
        evaluate_counts_in_parts(model, joined, [7, 0, 12])
    with pytest.raises(ValueError, match="parts' sizes"):
        evaluate_counts_in_parts(model, joined, [7, 0, 12, 6])
