"""The command line: partition JSON, demo table, and errors with exit status 2."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from fedbalance_benchmarks._runs import mean_std
from fl_adapters.cli import main

REQUIRED_KEYS = {
    "dataset",
    "num_samples",
    "num_classes",
    "seed",
    "spec",
    "elapsed_s",
    "clients",
    "stats",
}
CLIENT_KEYS = {"indices", "num_samples", "class_counts", "noise_std", "split"}


def run_partition(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / name
    code = main(
        [
            "partition",
            "--dataset",
            "digits",
            "--clients",
            "8",
            "--seed",
            "3",
            "--out",
            str(out),
            *extra,
        ]
    )
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_partition_writes_the_documented_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, doc = run_partition(
        tmp_path,
        "p.json",
        "--scheme",
        "label_dirichlet",
        "--set",
        "beta=0.3",
        "--set",
        "min_size=5",
        "--plot",
        str(tmp_path / "p.png"),
    )
    assert code == 0
    assert REQUIRED_KEYS <= set(doc)
    assert doc["dataset"] == "digits" and doc["num_classes"] == 10 and doc["seed"] == 3
    assert doc["spec"] == {"name": "label_dirichlet", "beta": 0.3, "min_size": 5, "max_tries": 100}
    assert len(doc["clients"]) == 8
    all_idx = np.concatenate([c["indices"] for c in doc["clients"]])
    assert sorted(all_idx.tolist()) == list(range(doc["num_samples"]))
    for c in doc["clients"]:
        assert CLIENT_KEYS <= set(c) and set(c["split"]) == {"train", "val", "test"}
        assert sum(c["class_counts"]) == c["num_samples"] == len(c["indices"])
    assert (tmp_path / "p.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "| label_dirichlet | 8" in out and "KL uniform" in out
    assert not (tmp_path / "p.noise.png").exists()  # no feature noise, no noise picture


def test_partition_plots_feature_noise_in_pixel_units(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _ = run_partition(
        tmp_path, "f.json", "--scheme", "feature_noise", "--plot", str(tmp_path / "f.png")
    )
    assert code == 0 and (tmp_path / "f.noise.png").stat().st_size > 1000
    assert "(feature noise, pixel units)" in capsys.readouterr().out


def test_same_seed_same_json_apart_from_the_timing(tmp_path: Path) -> None:
    _, a = run_partition(tmp_path, "a.json", "--scheme", "mixed")
    _, b = run_partition(tmp_path, "b.json", "--scheme", "mixed")
    assert a.pop("elapsed_s") >= 0 and b.pop("elapsed_s") >= 0
    assert json.dumps(a) == json.dumps(b)
    _, c = run_partition(tmp_path, "c.json", "--scheme", "mixed", "--seed", "4")
    assert c["clients"][0]["indices"] != a["clients"][0]["indices"]


def test_spec_file_and_npy_labels(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(4), 25)
    np.save(tmp_path / "labels.npy", labels)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: label_quantity\nk: 2\n")
    out = tmp_path / "q.json"
    code = main(
        [
            "partition",
            "--dataset",
            f"npy:{tmp_path / 'labels.npy'}",
            "--spec",
            str(spec),
            "--clients",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert [sum(1 for n in c["class_counts"] if n) for c in doc["clients"]] == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--scheme", "label_dirichlet", "--set", "beta=-1"],
            "beta must be a finite float > 0, got -1",
        ),
        (["--scheme", "label_dirichlett"], "did you mean 'label_dirichlet'?"),
        (
            ["--scheme", "label_quantity", "--set", "k=11"],
            "k must be between 1 and num_classes=10, got 11",
        ),
        (["--scheme", "iid", "--set", "beta=0.5"], "iid: unknown parameter(s) beta"),
        (["--scheme", "iid", "--set", "nonsense"], "--set expects key=value, got 'nonsense'"),
        (
            ["--scheme", "iid", "--clients", "5000"],
            "num_clients must be at most the number of samples (1438), got 5000",
        ),
    ],
    ids=["negative-beta", "typo", "k-too-large", "unknown-param", "bad-set", "too-many-clients"],
)
def test_bad_input_exits_2_with_a_message(tmp_path: Path, capsys, args, message) -> None:  # type: ignore[no-untyped-def]
    argv = [
        "partition",
        "--dataset",
        "digits",
        "--clients",
        "8",
        "--out",
        str(tmp_path / "x.json"),
        *args,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_missing_dataset_says_how_to_get_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(
        [
            "partition",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path),
            "--scheme",
            "iid",
            "--clients",
            "2",
            "--out",
            str(tmp_path / "x.json"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "cifar10 not found under" in err and "--download" in err


def test_argparse_rejects_non_positive_clients(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(
            ["partition", "--dataset", "digits", "--scheme", "iid", "--clients", "0", "--out", "x"]
        )
    assert exc.value.code == 2
    assert "must be an int >= 1, got 0" in capsys.readouterr().err


def test_demo_prints_the_five_scenarios(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["demo", "--out", str(tmp_path), "--clients", "10", "--no-train"]) == 0
    out = capsys.readouterr().out
    for scenario in ("iid", "label", "quantity", "feature", "mixed"):
        assert f"| {scenario} " in out
    assert (tmp_path / "partitions.md").read_text().count("\n") == 7
    assert (tmp_path / "mixed_noise.png").exists() and (tmp_path / "label_bars.png").exists()


@pytest.mark.slow
def test_quick_thesis_bench_writes_tables_and_plots(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = "bench thesis --quick --dataset digits --rounds 2 --workers 1".split()
    argv += ["--scenarios", "iid", "mixed", "--aggregators", "fedavg", "fedloss"]
    argv += ["--out", str(tmp_path)]
    code = main(argv)
    assert code == 0
    table = (tmp_path / "thesis_digits_quick.md").read_text()
    assert (
        "### iid" in table and "### mixed" in table and "| fedloss " in table and "acc@2" in table
    )
    doc = json.loads((tmp_path / "thesis_digits_quick.json").read_text())
    assert len(doc["runs"]) == 4 and all(len(r["accuracy"]) == 2 for r in doc["runs"])
    assert (tmp_path / "thesis_digits_quick_mixed.png").stat().st_size > 1000
    # bias figures beside accuracy: the record keeps each evaluated round's figures from the
    # run's metrics, and the report's cell is their mean over the final rounds
    run = tmp_path / "runs" / "thesis_digits_quick" / "mixed" / "fedloss" / "seed0"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in doc["runs"] if (r["scenario"], r["aggregator"]) == ("mixed", "fedloss")]
    keys = ("balanced_accuracy", "worst_class_recall", "client_acc_p10")
    for key in keys:
        assert record["bias"][key] == [r[key] for r in rows if "test_accuracy" in r]
    (line,) = [ln for ln in table.splitlines() if ln.startswith("| mixed ") and "| fedloss " in ln]
    cells = [c.strip() for c in line.strip("|").split("|")]
    figures = [statistics.mean(record["bias"][k]) for k in keys]  # 2 rounds: all final
    assert cells[2:] == [
        mean_std([statistics.mean(record["accuracy"])]),
        *map(mean_std, [[f] for f in figures]),
    ]
    # a second call resumes: nothing is re-run, the table is the same
    assert main(argv) == 0
    assert (tmp_path / "thesis_digits_quick.md").read_text().split("\n", 4)[4] == table.split(
        "\n", 4
    )[4]
    # the compact per-run records are what resumes a grid; --no-run reports them alone
    records = sorted((tmp_path / "per-run" / "thesis_digits_quick").rglob("seed*.json"))
    assert [p.relative_to(tmp_path / "per-run").as_posix() for p in records] == [
        f"thesis_digits_quick/{s}/{a}/seed0.json"
        for s in ("iid", "mixed")
        for a in ("fedavg", "fedloss")
    ]
    argv = ["bench", "thesis", "--quick", "--dataset", "digits", "--rounds", "2", "--seeds", "2"]
    argv += ["--scenarios", "iid", "mixed", "--aggregators", "fedavg", "fedloss"]
    assert main([*argv, "--out", str(tmp_path), "--no-run"]) == 0
    partial = (tmp_path / "thesis_digits_quick.md").read_text()
    assert "**Unfinished: 4 of 8 runs recorded**" in partial
    assert not (tmp_path / "runs" / "thesis_digits_quick" / "iid" / "fedavg" / "seed1").exists()


def test_a_bad_parameter_is_one_line_and_a_bug_keeps_its_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only fedbalance's own errors become exit 2 and one line; a ValueError from a bug in
    our code reaches the user with its traceback."""
    import fl_adapters.cli as cli
    from fl_partitions import ParameterError

    np.save(tmp_path / "labels.npy", np.repeat(np.arange(4), 25))
    argv = ["partition", "--dataset", f"npy:{tmp_path / 'labels.npy'}", "--clients", "4"]
    argv += ["--out", str(tmp_path / "p.json")]
    assert main([*argv, "--scheme", "label_dirichlet", "--set", "beta=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "beta must be a finite float > 0, got -1" in err[0]
    with pytest.raises(ParameterError):  # one error type for every plugin parameter
        cli.get_registry().make_partitioner({"name": "label_dirichlet", "gamma": 1})

    class Broken:
        def as_dict(self) -> dict:
            raise ValueError("a bug in fedbalance")

    monkeypatch.setattr(cli, "get_registry", Broken)
    with pytest.raises(ValueError, match="a bug in fedbalance"):
        main(["list"])


def test_a_run_that_fails_once_started_exits_1_not_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """RunFailed is one of fedbalance's errors, but it says the run broke, not the input."""
    import fl_adapters.cli as cli
    from fl_adapters.config import RunFailed

    def dies() -> None:
        raise RunFailed("client process 1 was killed by signal 9 after round 2")

    monkeypatch.setattr(cli, "get_registry", dies)
    assert main(["list"]) == 1
