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


def test_the_residual_stream_stays_in_the_autocast_dtype():
    model = Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=8).eval()
    seen = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(3, 8, 5))
    assert seen == [torch.bfloat16] * len(model.blocks)  # the fp32 position table no longer promotes it


def test_padding_keeps_one_shape_and_changes_nothing_it_trains_on():
    from trainers.forecast.model import TrainStep
    from trainers.forecast.train import padded

    torch.manual_seed(0)
    step = TrainStep(Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=8, dropout=0.0))
    x, y = torch.randn(7, 8, 5), torch.randn(7)
    ids, weight = padded(torch.arange(5), 7)
    assert ids.tolist() == [0, 1, 2, 3, 4, 0, 0] and weight.tolist() == [1, 1, 1, 1, 1, 0, 0]
    loss_padded, _ = step(x[ids], y[ids], weight, torch.tensor(1.0))
    loss_padded.backward()
    grads = [p.grad.clone() for p in step.parameters()]
    step.zero_grad()
    loss, _ = step(x[:5], y[:5], torch.ones(5), torch.tensor(1.0))
    loss.backward()
    torch.testing.assert_close(loss_padded, loss)
    for g, p in zip(grads, step.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_a_compiled_step_does_not_recompile_for_a_short_last_batch():
    from trainers.forecast.model import TrainStep
    from trainers.forecast.train import padded

    def run(pad: bool) -> int:
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        step = torch.compile(TrainStep(Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=8)), backend=backend,
                             dynamic=False)
        for n in (16, 16, 15, 16):  # 15: the end of an epoch
            ids, weight = padded(torch.arange(n), 16) if pad else (torch.arange(n), torch.ones(n))
            step(torch.randn(len(ids), 8, 5), torch.randn(len(ids)), weight, torch.tensor(1.0))
        return len(graphs)

    assert run(pad=True) == 1
    assert run(pad=False) == 2  # what the padding prevents: a recompile mid-run
