"""LRN (numpy loops), BatchNorm (Caffe's accumulator update rule), Scale, Bias and MVN (numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparkdp.errors import ConfigError


def lrn_across(x, n, alpha, beta, k):
    out = np.empty_like(x)
    C = x.shape[1]
    for c in range(C):
        lo, hi = max(0, c - (n - 1) // 2), min(C, c + (n - 1) // 2 + 1)
        scale = k + alpha / n * (x[:, lo:hi] ** 2).sum(axis=1)
        out[:, c] = x[:, c] * scale ** (-beta)
    return out


def lrn_within(x, n, alpha, beta):
    N, C, H, W = x.shape
    pad = (n - 1) // 2
    out = np.empty_like(x)
    for i in range(H):
        for j in range(W):
            window = x[:, :, max(0, i - pad) : i + pad + 1, max(0, j - pad) : j + pad + 1]
            avg = (window**2).sum(axis=(2, 3)) / (n * n)  # padded cells count in the divisor
            out[:, :, i, j] = x[:, :, i, j] * (1 + alpha * avg) ** (-beta)
    return out


def test_lrn_across_channels(build):
    net = build(
        'layer { name: "l" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }',
        x=(2, 5, 3, 3),
    )
    x = torch.randn(2, 5, 3, 3)
    np.testing.assert_allclose(net(x).numpy(), lrn_across(x.double().numpy(), 3, 0.5, 0.75, 2.0), rtol=1e-5)


def test_lrn_within_channel_ignores_k(build):
    net = build(
        'layer { name: "l" type: "LRN" bottom: "x" top: "y" '
        "lrn_param { local_size: 3 alpha: 0.3 beta: 0.75 k: 7 norm_region: WITHIN_CHANNEL } }",
        x=(2, 3, 4, 5),
    )
    x = torch.randn(2, 3, 4, 5)
    np.testing.assert_allclose(net(x).numpy(), lrn_within(x.double().numpy(), 3, 0.3, 0.75), rtol=1e-5)
    with pytest.raises(ConfigError, match="local_size must be odd"):
        build(
            'layer { name: "l" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 4 } }', x=(1, 1, 2, 2)
        )


BN = 'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" batch_norm_param { eps: 0.001 %s } }'


def test_batchnorm_train_updates_caffe_accumulators(build):
    net = build(BN % "moving_average_fraction: 0.9", phase="TRAIN", x=(4, 2, 3, 3))
    mean_acc, var_acc, factor = net.blobs_of("bn")
    assert [tuple(b.shape) for b in (mean_acc, var_acc, factor)] == [(2,), (2,), (1,)]
    s, m_ref, v_ref = 0.0, np.zeros(2), np.zeros(2)
    m = 4 * 3 * 3
    for step in range(3):
        x = torch.randn(4, 2, 3, 3) * (step + 1) + step
        xd = x.double().numpy()
        mu, var = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
        y = net(x)
        np.testing.assert_allclose(
            y.numpy(),
            (xd - mu[None, :, None, None]) / np.sqrt(var + 0.001)[None, :, None, None],
            rtol=1e-4,
            atol=1e-5,
        )
        s, m_ref, v_ref = 0.9 * s + 1, mu + 0.9 * m_ref, m / (m - 1) * var + 0.9 * v_ref
        assert factor.item() == pytest.approx(s)
        np.testing.assert_allclose(mean_acc.numpy(), m_ref, rtol=1e-5)
        np.testing.assert_allclose(var_acc.numpy(), v_ref, rtol=1e-5)
    # Global statistics (eval mode, or the TEST phase) use accumulator / scale factor.
    net.eval()
    x = torch.randn(4, 2, 3, 3)
    mu, var = m_ref / s, v_ref / s
    expected = (x.double().numpy() - mu[None, :, None, None]) / np.sqrt(var + 0.001)[None, :, None, None]
    np.testing.assert_allclose(net(x).numpy(), expected, rtol=1e-4, atol=1e-5)
    assert factor.item() == pytest.approx(s)  # no update in eval mode


def test_batchnorm_use_global_stats_honoured_in_training(build):
    net = build(BN % "use_global_stats: true", phase="TRAIN", x=(4, 2))
    assert net.training
    with torch.no_grad():
        mean_acc, var_acc, factor = net.blobs_of("bn")
        mean_acc.copy_(torch.tensor([2.0, 4.0]))
        var_acc.copy_(torch.tensor([8.0, 18.0]))
        factor.fill_(2.0)
    x = torch.randn(4, 2)
    torch.testing.assert_close(
        net(x), (x - torch.tensor([1.0, 2.0])) / torch.sqrt(torch.tensor([4.0, 9.0]) + 0.001)
    )
    assert factor.item() == 2.0
    zero = build(BN % "", phase="TEST", x=(3, 2))  # scale factor 0 → mean = var = 0
    x = torch.randn(3, 2)
    torch.testing.assert_close(zero(x), x / (0.001**0.5))
    assert list(dict(zero.named_parameters())) == []
    with pytest.raises(ConfigError, match="statistics blobs are not learned"):
        build('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" param { lr_mult: 1 } }', x=(3, 2))


def test_scale_one_bottom_with_bias(build):
    net = build(
        'layer { name: "s" type: "Scale" bottom: "x" top: "y" scale_param { bias_term: true } }',
        x=(2, 3, 2, 2),
    )
    gamma, beta = net.blobs_of("s")
    assert torch.all(gamma == 1) and torch.all(beta == 0)  # Scale's default filler is constant 1
    with torch.no_grad():
        gamma.copy_(torch.tensor([1.0, 2.0, 3.0]))
        beta.copy_(torch.tensor([0.5, 0.0, -1.0]))
    x = torch.randn(2, 3, 2, 2)
    torch.testing.assert_close(net(x), x * gamma.view(1, 3, 1, 1) + beta.view(1, 3, 1, 1))


def test_scale_axes_and_two_bottoms(build):
    net = build(
        'layer { name: "s" type: "Scale" bottom: "x" top: "y" scale_param { axis: 1 num_axes: 2 } }',
        x=(2, 3, 4),
    )
    (gamma,) = net.blobs_of("s")
    assert gamma.shape == (3, 4)
    scalar = build(
        'layer { name: "s" type: "Scale" bottom: "x" top: "y" scale_param { num_axes: 0 '
        'filler { type: "constant" value: 3 } } }',
        x=(2, 3),
    )
    assert scalar.blobs_of("s")[0].shape == ()
    torch.testing.assert_close(scalar(torch.ones(2, 3)), torch.full((2, 3), 3.0))
    two = build(
        'layer { name: "s" type: "Scale" bottom: "x" bottom: "g" top: "y" scale_param { bias_term: true } }',
        x=(2, 3, 4),
        g=(3,),
    )
    assert [tuple(b.shape) for b in two.blobs_of("s")] == [(3,)]  # only the bias is learned
    x, g = torch.randn(2, 3, 4), torch.randn(3)
    torch.testing.assert_close(two(x=x, g=g), x * g.view(1, 3, 1))
    with pytest.raises(ConfigError, match=r"second bottom 'g' has shape \[4\], which must equal"):
        build('layer { name: "s" type: "Scale" bottom: "x" bottom: "g" top: "y" }', x=(2, 3, 4), g=(4,))


def test_bias_layer(build):
    net = build(
        'layer { name: "b" type: "Bias" bottom: "x" top: "y" bias_param { axis: -1 '
        'filler { type: "constant" value: 2 } } }',
        x=(2, 3),
    )
    (b,) = net.blobs_of("b")
    assert b.shape == (3,)
    torch.testing.assert_close(net(torch.zeros(2, 3)), torch.full((2, 3), 2.0))
    two = build('layer { name: "b" type: "Bias" bottom: "x" bottom: "c" top: "y" }', x=(2, 3, 2), c=(3, 2))
    assert two.blobs_of("b") == []
    x, c = torch.randn(2, 3, 2), torch.randn(3, 2)
    torch.testing.assert_close(two(x=x, c=c), x + c)


@pytest.mark.parametrize("across", [False, True])
@pytest.mark.parametrize("variance", [True, False])
def test_mvn_matches_numpy(build, across, variance):
    net = build(
        'layer { name: "m" type: "MVN" bottom: "x" top: "y" '
        f"mvn_param {{ across_channels: {str(across).lower()} normalize_variance: {str(variance).lower()} }} }}",
        x=(2, 3, 4, 5),
    )
    x = torch.randn(2, 3, 4, 5) * 3 + 1
    a = x.double().numpy()
    axes = (1, 2, 3) if across else (2, 3)
    centred = a - a.mean(axis=axes, keepdims=True)
    if variance:  # eps (1e-9) is added to the standard deviation, not to the variance
        centred = centred / (np.sqrt((centred**2).mean(axis=axes, keepdims=True)) + 1e-9)
    torch.testing.assert_close(net(x), torch.from_numpy(centred).float(), rtol=1e-4, atol=1e-5)
