"""Partition plots (matplotlib, PNG): class bars, count heat map, noise-level image grid.

matplotlib is an optional dependency (``fedbalance[bench]``); it is imported on first use,
with the non-interactive Agg backend so plotting works on headless machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_partitions.partition import Partition


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'fedbalance[bench]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_class_bars(
    partition: Partition,
    path: str | Path,
    *,
    title: str = "",
    class_names: Sequence[str] | None = None,
) -> Path:
    """Stacked per-client class-count bars (the FedLoss thesis's Figures 6-8), true labels;
    a marker above the bars of the clients whose labels are flipped (``label_noise``)."""
    plt = _pyplot()
    counts = partition.class_counts
    k, c = counts.shape
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * k + 2), 4))
    cmap = plt.get_cmap("tab10" if c <= 10 else "tab20")
    bottom = np.zeros(k)
    for j in range(c):
        label = class_names[j] if class_names else str(j)
        ax.bar(
            np.arange(k),
            counts[:, j],
            bottom=bottom,
            color=cmap(j % cmap.N),
            label=label,
            width=0.85,
        )
        bottom += counts[:, j]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title(title or partition.spec.get("name", ""))
    if partition.label_flips:  # noisy clients: a marker above their bars
        noisy = sorted(partition.label_flips)
        ax.scatter(noisy, bottom[noisy] + 0.03 * bottom.max(), marker="v", color="black", s=18)
        ax.set_title(f"{ax.get_title()}\n\u25bc noisy labels ({len(noisy)} of {k} clients)")
    if c <= 20:
        ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_heatmap(partition: Partition, path: str | Path, *, title: str = "") -> Path:
    """Client x class heat map of sample counts."""
    plt = _pyplot()
    counts = partition.class_counts
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.35 * counts.shape[1] + 2), max(3.0, 0.12 * counts.shape[0] + 1.5))
    )
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or partition.spec.get("name", ""))
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_noise_grid(
    images: Sequence[Any],
    noise_levels: Sequence[float],
    path: str | Path,
    *,
    seed: int = 0,
    title: str = "",
    pixel_scale: float = 1.0,
) -> Path:
    """Sample images (rows) under each noise level (columns), as the thesis's Figures 9-10.

    ``images`` are (C, H, W) tensors or arrays; noise is the same fixed per-sample noise that
    :class:`fl_partitions.transforms.NoisyDataset` adds (client = column). Noise levels are in
    pixel units; ``pixel_scale`` is the images' units per pixel unit (``1 / std`` of their
    normalisation), as for ``NoisyDataset``.
    """
    from fl_partitions.transforms import sample_noise

    plt = _pyplot()
    rows, cols = len(images), len(noise_levels)
    fig, axes = plt.subplots(rows, cols, figsize=(1.4 * cols, 1.4 * rows + 0.4), squeeze=False)
    for r, img in enumerate(images):
        x = np.asarray(img, dtype=np.float32)
        for col, std in enumerate(noise_levels):
            noise = sample_noise(x.shape, float(std) * pixel_scale, seed, col, r).numpy()
            noisy = x + noise
            ax = axes[r][col]
            ax.imshow(noisy.transpose(1, 2, 0).squeeze(), cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"pixel std {std:.3g}", fontsize=8)
    fig.suptitle(title or "feature noise by client")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_partition_noise(partition: Partition, train: Any, path: str | Path) -> Path:
    """A few of client 0's images (``train``: the dataset the partition indexes) under the
    feature noise of five clients from the first to the last, in pixel units as runs add it."""
    clients = partition.num_clients
    cols = sorted({0, clients // 4, clients // 2, (3 * clients) // 4, clients - 1})
    return plot_noise_grid(
        [train[int(i)][0] for i in partition.client_indices[0][:4]],
        [float(partition.noise_std[c]) for c in cols],
        path,
        seed=partition.seed,
        pixel_scale=float(getattr(train, "pixel_scale", 1.0)),
    )
