"""RunningStandardise (the graph heads' input standardisation): the same function of each row in
training and evaluation, statistics from training batches only, untouched inside torch.func."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models.derivatives import set_derivatives
from hydragnn.models.nn.standardise import RunningStandardise
from hydragnn.models.testing import CUTOFF, build
from hydragnn.models.testing.graphs import collate, periodic_samples


def test_rows_do_not_see_each_other_and_the_first_batch_sets_the_statistics():
    torch.manual_seed(0)
    norm = RunningStandardise(3, momentum=0.25).train()
    x = torch.randn(8, 3) * 4 + 10
    out = norm(x)
    torch.testing.assert_close(out, x * (1 + 1e-5) ** -0.5)  # the (identity) buffers: forward changes nothing
    assert int(norm.num_batches_tracked) == 0
    norm.update(x)
    torch.testing.assert_close(norm.running_mean, x.mean(0))
    torch.testing.assert_close(norm.running_std, x.std(0, unbiased=False))
    single = norm(x[:1].clone())  # one row, in training mode: its own output, no batch statistics
    torch.testing.assert_close(single, norm.eval()(x[:1]))
    norm.update(x[:1])
    torch.testing.assert_close(norm.running_mean, 0.75 * x.mean(0) + 0.25 * x[0])  # a single row moves the mean
    mean_before = norm.running_mean.clone()
    y = torch.randn(5, 3)
    norm.update(y)
    torch.testing.assert_close(norm.running_mean, 0.75 * mean_before + 0.25 * y.mean(0))
    z = norm.eval()(x)
    torch.testing.assert_close(z[3:4], norm(x[3:4]))  # batch == single in evaluation
    torch.testing.assert_close(z.mean(0), ((x - norm.running_mean) / (norm.running_std**2 + 1e-5).sqrt()).mean(0))


def test_rows_beyond_a_representable_variance_keep_finite_statistics_and_outputs():
    """float32 rows near 1e20 (a drifting encoder's, docs/notes/upstream_configs_dead_heads.md):
    their variance is not a float32, their standard deviation is; the outputs stay standardised."""
    g = torch.Generator().manual_seed(1)
    norm = RunningStandardise(2, momentum=1.0).train()  # each batch sets the statistics
    for scale in (1e18, 1e20, 1e22):
        x = torch.randn(16, 2, generator=g) * scale
        norm.update(x)
        out = norm(x)
        assert torch.isfinite(norm.running_std).all() and torch.isfinite(out).all()
        torch.testing.assert_close(norm.running_std, x.double().std(0, unbiased=False).float())
        torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(2))


def test_rows_that_are_not_finite_do_not_move_the_statistics():
    norm = RunningStandardise(2, momentum=0.5).train()
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    norm.update(x)
    before = (norm.running_mean.clone(), norm.running_std.clone())
    norm.update(torch.tensor([[float("nan"), 1.0], [float("inf"), 0.0]]))  # no finite row: no change
    torch.testing.assert_close((norm.running_mean, norm.running_std), before)
    assert int(norm.num_batches_tracked) == 1
    norm.update(torch.tensor([[5.0, 10.0], [float("nan"), 0.0], [7.0, 14.0]]))  # the finite rows count
    torch.testing.assert_close(norm.running_mean, 0.5 * before[0] + 0.5 * torch.tensor([6.0, 12.0]))
    # the variance moves by momentum
    torch.testing.assert_close(norm.running_std, (0.5 * before[1] ** 2 + 0.5 * torch.tensor([1.0, 4.0])).sqrt())


def test_statistics_do_not_carry_gradients_and_bad_momentum_is_refused():
    norm = RunningStandardise(2).train()
    x = torch.randn(4, 2, requires_grad=True)
    norm.update(x)
    norm(x).sum().backward()
    assert x.grad is not None and not norm.running_mean.requires_grad
    with pytest.raises(ValueError, match="momentum"):
        RunningStandardise(2, momentum=0.0)


def test_both_derivative_engines_train_the_statistics_alike():
    """torch.func.grad cannot mutate buffers: the model updates the statistics after its forward,
    so the "func" engine (compiled training) moves them exactly as autograd does."""
    batch = collate(periodic_samples(CUTOFF)[:3])
    stats = []
    for engine in ("autograd", "func"):
        model = build("SchNet", seed=0).train()
        set_derivatives(model, engine)
        for _ in range(2):
            loss, _ = model.loss(model(batch), batch)
            loss.backward()
        norm = model.graph_heads.input_norm
        assert int(norm.num_batches_tracked) == 2
        stats.append((norm.running_mean.clone(), norm.running_std.clone()))
    torch.testing.assert_close(stats[0], stats[1])
    assert stats[0][0].abs().sum() > 0
    model.eval()(batch)
    assert int(model.graph_heads.input_norm.num_batches_tracked) == 2  # evaluation leaves them
