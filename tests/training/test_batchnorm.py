"""BatchNorm handling: `init` randomises every BatchNorm's statistics, training re-estimates
them before each evaluation; both must find every kind of BatchNorm a model may hold."""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.nn.layers import batch_norms
from bnnexport.stages.init import randomize_batchnorm
from bnnexport.training.loop import recalibrate_batchnorm


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(6), nn.BatchNorm1d(6)
    )


def test_batch_norms_finds_1d_2d_and_lazy_ones():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.LazyBatchNorm2d(), nn.BatchNorm3d(2), nn.ReLU())
    assert [type(m).__name__ for m in batch_norms(model)] == [
        "BatchNorm1d", "LazyBatchNorm2d", "BatchNorm3d"
    ]  # fmt: skip


def test_randomize_batchnorm_draws_every_statistic_away_from_its_default():
    model = _model()
    model(torch.randn(2, 2, 3, 3))  # materialise the lazy layer
    randomize_batchnorm(model, seed=0)
    assert len(batch_norms(model)) == 2
    for bn in batch_norms(model):
        assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.equal(bn.running_var, torch.ones_like(bn.running_var))


def test_recalibrate_batchnorm_sets_exact_averages_over_the_batches():
    torch.manual_seed(0)
    model = _model()
    batches = [(torch.randn(8, 2, 3, 3) + 1.0, None) for _ in range(3)]
    model(batches[0][0])
    recalibrate_batchnorm(model, batches)
    with torch.no_grad():
        conv = torch.cat([model[0](x) for x, _ in batches])
    expected = conv.mean(dim=(0, 2, 3))
    assert torch.allclose(model[1].running_mean, expected, atol=1e-5)
    assert model[4].num_batches_tracked == 3
    assert model.training and model[1].momentum == 0.1  # the caller's mode and momentum back
