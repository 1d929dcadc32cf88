"""The digits examples' data and model, the same under Horovod (digits_train.py) and torchrun
(torchrun/digits.py): scikit-learn's 8x8 digits, shipped inside the package (nothing is
downloaded), split 80/20 with a fixed seed, and a small CNN."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def data() -> tuple[torch.utils.data.TensorDataset, torch.Tensor, torch.Tensor]:
    """The digits as 1x8x8 images in [0, 1], split 80/20 with a fixed seed (the same split
    everywhere)."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    train = torch.utils.data.TensorDataset(
        torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train)
    )
    return train, torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test)


def model_() -> torch.nn.Module:
    torch.manual_seed(7)  # every rank starts from the same weights
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 4 * 4, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())
