"""Caffe's fillers: defaults, fan-in variance, bilinear weights, seeding."""

from __future__ import annotations

import math

import pytest
import torch

from sparkdp.caffe.layers.fillers import fill_
from sparkdp.caffe.textformat import parse
from sparkdp.errors import ConfigError


def _filler(text: str):
    return parse(f"f {{ {text} }}").get("f")


def test_constant_defaults():
    assert torch.all(fill_(torch.ones(3), None) == 0)  # no filler: constant 0
    assert torch.all(fill_(torch.ones(3), None, default_value=1.0) == 1)  # Scale's default
    assert torch.all(fill_(torch.ones(3), _filler('type: "constant"'), default_value=1.0) == 0)
    assert torch.all(fill_(torch.zeros(3), _filler("value: 2")) == 2)


@pytest.mark.parametrize(
    ("norm", "n"),
    [("", 4 * 3 * 3), ("variance_norm: FAN_OUT", 200 * 3 * 3), ("variance_norm: AVERAGE", (36 + 1800) / 2)],
)
def test_xavier_and_msra_use_caffe_fans(norm, n):
    torch.manual_seed(0)
    w = fill_(torch.empty(200, 4, 3, 3), _filler(f'type: "xavier" {norm}'))
    bound = math.sqrt(3 / n)
    assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
    m = fill_(torch.empty(200, 4, 3, 3), _filler(f'type: "msra" {norm}'))
    assert m.std().item() == pytest.approx(math.sqrt(2 / n), rel=0.05)


def test_gaussian_uniform_unitball_sparse():
    torch.manual_seed(0)
    g = fill_(torch.empty(100, 100), _filler('type: "gaussian" mean: 1 std: 0.5'))
    assert g.mean().item() == pytest.approx(1, abs=0.02) and g.std().item() == pytest.approx(0.5, rel=0.05)
    u = fill_(torch.empty(1000), _filler('type: "uniform" min: -2 max: -1'))
    assert u.min() >= -2 and u.max() <= -1
    b = fill_(torch.empty(5, 7), _filler('type: "positive_unitball"'))
    torch.testing.assert_close(b.sum(1), torch.ones(5))
    s = fill_(torch.empty(100, 50), _filler('type: "gaussian" sparse: 10'))  # keep prob 10/100
    assert 0.05 < (s != 0).float().mean().item() < 0.15


def test_bilinear_matches_formula():
    w = fill_(torch.empty(2, 1, 4, 4), _filler('type: "bilinear"'))
    f, c = 2, 3 / 4  # f = ceil(K/2), c = (K-1)/(2f)
    line = [1 - abs(x / f - c) for x in range(4)]
    expected = torch.tensor([[a * b for b in line] for a in line])
    torch.testing.assert_close(w[1, 0], expected)
    with pytest.raises(ConfigError, match="bilinear filler needs a 4-D blob"):
        fill_(torch.empty(3, 3), _filler('type: "bilinear"'))


def test_seeded_and_unknown():
    torch.manual_seed(5)
    a = fill_(torch.empty(4), _filler('type: "gaussian"'))
    torch.manual_seed(5)
    assert torch.equal(a, fill_(torch.empty(4), _filler('type: "gaussian"')))
    with pytest.raises(ConfigError, match="unknown filler type 'gauss'"):
        fill_(torch.empty(1), _filler('type: "gauss"'))
