"""Models (engine.train.models): shapes, heads, memory format, SyncBatchNorm refusal on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.core.config.schema import ConfigError, ModelConfig
from engine.train.models import SmallCNN, build_model, has_batchnorm, num_classes, prepare_model

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "resnet34", "resnet50"])
def test_models_classify_cifar_shaped_batches(name: str) -> None:
    model = build_model(ModelConfig(name=name)).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_imagenet_head_keeps_1000_classes() -> None:
    config = ModelConfig(name="resnet18", imagenet_head=True)
    assert num_classes(config) == 1000
    logits = build_model(config).eval()(torch.randn(1, 3, 32, 32))
    assert logits.shape == (1, 1000)
    small = build_model(ModelConfig(name="small_cnn", imagenet_head=True))
    assert isinstance(small, SmallCNN) and small.head.out_features == 1000


def test_same_seed_same_weights() -> None:
    torch.manual_seed(3)
    a = build_model(ModelConfig(name="small_cnn"))
    torch.manual_seed(3)
    b = build_model(ModelConfig(name="small_cnn"))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_small_cnn_without_batchnorm() -> None:
    model = SmallCNN(batchnorm=False)
    assert not has_batchnorm(model)
    assert has_batchnorm(SmallCNN())
    assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Conv2d))


def test_channels_last() -> None:
    model = prepare_model(
        build_model(ModelConfig(name="resnet18")), ModelConfig(channels_last=True), device=CPU
    )
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert model(x).shape == (2, 10)


def test_sync_batchnorm_is_refused_on_the_cpu_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="SyncBatchNorm only runs on GPU"):
        prepare_model(SmallCNN(), ModelConfig(), device=CPU, sync_batchnorm=True)
    # Nothing to convert, nothing to refuse.
    prepare_model(SmallCNN(batchnorm=False), ModelConfig(), device=CPU, sync_batchnorm=True)
