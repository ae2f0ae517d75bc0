"""Models of the papers the benchmarks reproduce.

* :class:`ThesisCNN` — the FedLoss thesis's CNN (Tagarakis 2023): LeNet-5 style, two 5x5
  convolutions with 6 and 16 channels, each followed by ReLU and 2x2 max-pooling, then fully
  connected layers of 120 and 84 units with ReLU. 44,426 parameters on 1x28x28 inputs and 10
  classes.
* :class:`AstraeaCNN` — Astraea's EMNIST CNN (Duan et al. 2021): conv 12 ch 5x5 stride 2,
  conv 18 ch 3x3 stride 2, dropout 0.5, conv 24 ch 2x2, FC 150, softmax output. 68,873
  parameters on 1x28x28 inputs and 47 classes. The paper does not say where the ReLUs go;
  we put one after each convolution and after the hidden FC layer, and leave the softmax to
  the loss (cross-entropy on logits).
"""

from __future__ import annotations

import torch
from torch import nn

from fl_checks import ParameterError

MODELS = ("thesis_cnn", "astraea_cnn")


class ThesisCNN(nn.Module):
    """The FedLoss thesis's LeNet-style CNN."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = ((image_size - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class AstraeaCNN(nn.Module):
    """Astraea's EMNIST CNN."""

    def __init__(self, in_channels: int = 1, num_classes: int = 47, image_size: int = 28) -> None:
        super().__init__()
        s1 = (image_size - 5) // 2 + 1
        s2 = (s1 - 3) // 2 + 1
        s3 = s2 - 1
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 12, 5, stride=2),
            nn.ReLU(),
            nn.Conv2d(12, 18, 3, stride=2),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Conv2d(18, 24, 2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(24 * s3 * s3, 150),
            nn.ReLU(),
            nn.Linear(150, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


#: Smallest image side each model's layers leave at least one pixel of.
MIN_IMAGE_SIZE = {"thesis_cnn": 16, "astraea_cnn": 13}


def build_model(name: str, *, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    if name in MIN_IMAGE_SIZE and image_size < MIN_IMAGE_SIZE[name]:
        raise ParameterError(
            f"model {name} needs images of at least {MIN_IMAGE_SIZE[name]}x"
            f"{MIN_IMAGE_SIZE[name]} pixels, got {image_size}x{image_size}"
        )
    if name == "thesis_cnn":
        return ThesisCNN(in_channels, num_classes, image_size)
    if name == "astraea_cnn":
        return AstraeaCNN(in_channels, num_classes, image_size)
    raise ParameterError(f"model must be one of {', '.join(MODELS)}, got {name!r}")


def model_for(
    name: str, dataset: str, data_dir: str | None = None, *, seed: int | None = None
) -> nn.Module:
    """Model ``name`` shaped for ``dataset``'s images and classes (see
    :func:`~fl_adapters.datasets.image_spec`), initialised from
    ``torch.manual_seed(seed)`` when a seed is given: the same weights in every process."""
    from fl_adapters.datasets import image_spec

    channels, size, classes = image_spec(dataset, data_dir)
    if seed is not None:
        torch.manual_seed(seed)
    return build_model(name, in_channels=channels, num_classes=classes, image_size=size)
