import pytest
import torch

from trainers.forecast.config import PRESETS
from trainers.forecast.model import Forecaster, ReturnPredictor, count_parameters


def test_151m_preset_is_within_2_percent_of_151_8m_without_allocating():
    with torch.device("meta"):
        model = Forecaster(**vars(PRESETS["151m"]), n_features=5, window=120)
    n = count_parameters(model)
    assert abs(n - 151.8e6) / 151.8e6 < 0.02, n
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_forward_shapes(preset):
    model = Forecaster(**vars(PRESETS[preset]), n_features=5, window=16).eval()
    assert model(torch.randn(3, 16, 5)).shape == (3,)


def test_predict_return_applies_target_scale():
    model = Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=8).eval()
    model.target_mean.fill_(0.01)
    model.target_std.fill_(0.05)
    x = torch.randn(4, 8, 5)
    torch.testing.assert_close(ReturnPredictor(model)(x), model(x) * 0.05 + 0.01)


def test_dropout_only_in_training():
    model = Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=8, dropout=0.5)
    x = torch.randn(4, 8, 5)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
