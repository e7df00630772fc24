"""Named models: each a list of operator problems (its conv2d and dense layers) at a batch size.

Only the layers that dominate a model's time are listed; activations and pooling are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.errors import NotFound
from fleet.tvm.operators import CONV2D, DENSE, check_problem


@dataclass(frozen=True)
class Layer:
    """One operator of a model."""

    name: str
    kind: str
    params: dict[str, Any]


def _conv(name: str, n: int, c: int, hw: int, f: int, k: int, stride: int = 1, pad: int = 0) -> Layer:
    params = {"n": n, "c": c, "h": hw, "w": hw, "f": f, "kh": k, "kw": k}
    params |= {"stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad}
    return Layer(name, CONV2D, check_problem(CONV2D, params))


def _dense(name: str, m: int, k: int, n: int) -> Layer:
    return Layer(name, DENSE, check_problem(DENSE, {"m": m, "k": k, "n": n}))


def tiny_cnn(batch: int) -> list[Layer]:
    """Two small convolutions and a classifier: small enough to tune in seconds (tests, demos)."""
    return [
        _conv("conv1", batch, 3, 8, 8, 3, pad=1),
        _conv("conv2", batch, 8, 8, 8, 3, stride=2, pad=1),
        _dense("fc", batch, 8 * 4 * 4, 10),
    ]


def lenet(batch: int) -> list[Layer]:
    """LeNet-5 on 28x28 images."""
    return [
        _conv("conv1", batch, 1, 28, 6, 5, pad=2),
        _conv("conv2", batch, 6, 14, 16, 5),
        _dense("fc1", batch, 400, 120),
        _dense("fc2", batch, 120, 84),
        _dense("fc3", batch, 84, 10),
    ]


def alexnet(batch: int) -> list[Layer]:
    """AlexNet's layers as MIOpenDriver's alexnet.txt lists them (227x227 input)."""
    return [
        _conv("conv1", batch, 3, 227, 64, 11, stride=4),
        _conv("conv2", batch, 64, 27, 192, 5, pad=2),
        _conv("conv3", batch, 192, 13, 384, 3, pad=1),
        _conv("conv4", batch, 384, 13, 256, 3, pad=1),
        _conv("conv5", batch, 256, 13, 256, 3, pad=1),
        _dense("fc6", batch, 9216, 4096),
        _dense("fc7", batch, 4096, 4096),
        _dense("fc8", batch, 4096, 1000),
    ]


MODELS: dict[str, Callable[[int], list[Layer]]] = {"tiny-cnn": tiny_cnn, "lenet": lenet, "alexnet": alexnet}


def model(name: str, batch: int) -> list[Layer]:
    """The layers of model ``name`` at ``batch``; :class:`NotFound` for an unknown name."""
    if name not in MODELS:
        raise NotFound(f"no model {name!r} (known: {', '.join(sorted(MODELS))})")
    return MODELS[name](batch)
