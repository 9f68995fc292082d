"""The schedules larq-zoo's recipes need (`bnnexport.optim.schedules`): piecewise constant
(x0.1 at epochs 100 and 110) and cosine decay after a linear warm-up."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from bnnexport.nn.layers import BinaryLinear
from bnnexport.optim.composite import latent_adam
from bnnexport.optim.schedules import CosineDecay, Piecewise, parse_schedule


def test_piecewise_holds_each_value_until_the_step_the_next_begins():
    schedule = parse_schedule("piecewise:4e-3,100,4e-4,110,4e-5")
    assert schedule == Piecewise((4e-3, 4e-4, 4e-5), (100, 110))
    assert [schedule(s) for s in (0, 99, 100, 109, 110, 10**6)] == [
        4e-3, 4e-3, 4e-4, 4e-4, 4e-5, 4e-5,
    ]  # fmt: skip
    assert schedule.scaled(10) == Piecewise((4e-3, 4e-4, 4e-5), (1000, 1100))


def test_cosine_warms_up_linearly_then_decays_to_zero():
    schedule = parse_schedule("cosine:1e-2,5,600")
    assert schedule == CosineDecay(1e-2, 5, 600)
    assert schedule(0) == 0.0 and schedule(5) == 1e-2
    assert schedule(305) == pytest.approx(0.5e-2)
    assert schedule(605) == pytest.approx(0.0, abs=1e-18) and schedule(10**6) == schedule(605)
    assert schedule(200) == pytest.approx(0.5e-2 * (1 + math.cos(math.pi * 195 / 600)))


@pytest.mark.parametrize("text", ["piecewise:1e-3,10", "piecewise:1e-3,10,1e-4,5,1e-5", "cosine:1"])
def test_a_malformed_schedule_names_the_forms_it_takes(text):
    with pytest.raises(ValueError, match="piecewise:V0,STEP1,V1,...' or 'cosine:PEAK,WARMUP"):
        parse_schedule(text)


def test_both_survive_an_optimizer_state_dict_saved_as_weights_only():
    def model():
        return nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))

    for text in ("piecewise:1e-2,3,1e-3", "cosine:1e-2,2,10"):
        optimizer = latent_adam(model(), lr=text)
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        buffer.seek(0)
        restored = latent_adam(model())
        restored.load_state_dict(torch.load(buffer, weights_only=True))
        assert restored.optimizers["adam"].schedules["lr"] == parse_schedule(text)
