"""The models a run can train: a small CNN for CPU runs and torchvision's ResNets.

``build_model`` makes the configured model with ``torch.manual_seed`` already set by the caller, so
every rank starts from the same weights. ``prepare_model`` applies the memory format and, under DDP,
the SyncBatchNorm conversion, and moves the model to its device.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.core.config.schema import ConfigError, ModelConfig
from engine.train.image_split import NUM_CLASSES
from engine.train.user_factories import build_user_model

IMAGENET_CLASSES = 1000


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head; trains on synthetic data in seconds on a CPU.

    ``batchnorm=False`` drops the BatchNorm layers (convs get biases instead): without per-batch
    statistics a DDP step on 2 ranks x b images equals a single-process step on 2b images, which is
    what the equivalence test checks on the CPU, where torch's SyncBatchNorm does not run.
    """

    def __init__(self, num_classes: int = NUM_CLASSES, *, batchnorm: bool = True, width: int = 16):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for i, out in enumerate((width, 2 * width, 4 * width)):
            layers.append(nn.Conv2d(channels, out, kernel_size=3, padding=1, bias=not batchnorm))
            if batchnorm:
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU(inplace=True))
            if i < 2:
                layers.append(nn.MaxPool2d(2))
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def num_classes(config: ModelConfig) -> int:
    """The data set's classes (``model.num_classes``, 10 for CIFAR-10), or 1000 when the preset
    keeps torchvision's ImageNet head."""
    return IMAGENET_CLASSES if config.imagenet_head else config.num_classes


def build_model(config: ModelConfig) -> nn.Module:
    """A freshly initialised model (``weights=None``: no download, random init from torch's seed):
    the user's ``model.factory`` when the preset names one, else the built-in ``model.name``."""
    classes = num_classes(config)
    if config.factory:
        return build_user_model(config, classes)
    if config.name == "small_cnn":
        return SmallCNN(classes)
    from torchvision import models

    builders = {
        "resnet18": models.resnet18,
        "resnet34": models.resnet34,
        "resnet50": models.resnet50,
    }
    return builders[config.name](weights=None, num_classes=classes)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def prepare_model(
    model: nn.Module,
    config: ModelConfig,
    *,
    device: torch.device,
    sync_batchnorm: bool = False,
) -> nn.Module:
    """Move ``model`` to ``device`` in the configured memory format; convert BatchNorm to
    SyncBatchNorm when asked (callers ask only under DDP).

    torch's SyncBatchNorm runs on GPUs only (DDP refuses it on CPU modules), so asking for it on the
    CPU is a ConfigError with that reason rather than a silent fallback.
    """
    if sync_batchnorm and has_batchnorm(model):
        if device.type == "cpu":
            raise ConfigError(
                "ddp.sync_batchnorm needs CUDA: torch's SyncBatchNorm only runs on GPU modules; "
                "set ddp.sync_batchnorm = false for CPU ranks"
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
