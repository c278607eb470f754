"""caffe/layers/recurrent.py: LSTM and RNN against torch.nn.LSTM / torch.nn.RNN and hand-worked steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparkdp.caffe import load_net, load_weights, save_weights
from sparkdp.errors import ConfigError

from .blobs import set_blobs

T, N, H = 5, 3, 4


def _layer(kind: str, bottoms: str, tops: str = 'top: "y"', extra: str = "") -> str:
    return (
        f'layer {{ name: "rec" type: "{kind}" {bottoms} {tops} '
        f"recurrent_param {{ num_output: {H} {extra} }} }}"
    )


LSTM_XC = _layer("LSTM", 'bottom: "x" bottom: "cont"')
RNN_XC = _layer("RNN", 'bottom: "x" bottom: "cont"')


def _cont(steps: int = T, batch: int = N) -> torch.Tensor:
    cont = torch.ones(steps, batch)
    cont[0] = 0
    return cont


def _caffe_to_torch_gates(w: torch.Tensor) -> torch.Tensor:
    """Caffe's gate blocks i, f, o, g -> torch's i, f, g, o."""
    i, f, o, g = w.chunk(4, dim=0)
    return torch.cat([i, f, g, o], dim=0)


def _torch_lstm(w_xc, b_c, w_hc) -> torch.nn.LSTM:
    ref = torch.nn.LSTM(w_xc.shape[1], H)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(_caffe_to_torch_gates(w_xc))
        ref.bias_ih_l0.copy_(_caffe_to_torch_gates(b_c))
        ref.weight_hh_l0.copy_(_caffe_to_torch_gates(w_hc))
        ref.bias_hh_l0.zero_()
    return ref


def _random_lstm_blobs(d: int, d_static: int | None = None) -> list[torch.Tensor]:
    blobs = [torch.randn(4 * H, d) * 0.5, torch.randn(4 * H) * 0.5]
    if d_static is not None:
        blobs.append(torch.randn(4 * H, d_static) * 0.5)
    return [*blobs, torch.randn(4 * H, H) * 0.5]


def _random_rnn_blobs(d: int, d_static: int | None = None) -> list[torch.Tensor]:
    blobs = [torch.randn(H, d) * 0.5, torch.randn(H) * 0.5]
    if d_static is not None:
        blobs.append(torch.randn(H, d_static) * 0.5)
    return [*blobs, torch.randn(H, H) * 0.5, torch.randn(H, H) * 0.5, torch.randn(H) * 0.5]


def test_lstm_equals_torch_lstm_with_gates_reordered(build):
    net = build(LSTM_XC, x=(T, N, 2, 3), cont=(T, N))
    w_xc, b_c, w_hc = _random_lstm_blobs(6)
    set_blobs(net, "rec", w_xc, b_c, w_hc)
    x = torch.randn(T, N, 2, 3)
    y = net(x=x, cont=_cont())
    assert y.shape == (T, N, H) and net.blob_shapes["y"] == (T, N, H)
    expected, _ = _torch_lstm(w_xc, b_c, w_hc)(x.reshape(T, N, 6))  # features flattened from axis 2
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    # Copying the rows without reordering (torch's i, f, g, o read as Caffe's) gives another model.
    naive = torch.nn.LSTM(6, H)
    with torch.no_grad():
        naive.weight_ih_l0.copy_(w_xc), naive.bias_ih_l0.copy_(b_c), naive.weight_hh_l0.copy_(w_hc)
        naive.bias_hh_l0.zero_()
    assert not torch.allclose(y, naive(x.reshape(T, N, 6))[0], atol=1e-3)


def test_lstm_cont_zero_restarts_the_sequence(build):
    net = build(LSTM_XC, x=(T, N, 2), cont=(T, N))
    blobs = _random_lstm_blobs(2)
    set_blobs(net, "rec", *blobs)
    x, cont = torch.randn(T, N, 2), _cont()
    cont[2, 1] = 0  # sample 1 starts a new sequence at t = 2; the others continue
    y = net(x=x, cont=cont)
    ref = _torch_lstm(*blobs)
    whole, _ = ref(x)
    torch.testing.assert_close(y[:, [0, 2]], whole[:, [0, 2]], atol=1e-5, rtol=1e-5)
    first, _ = ref(x[:2, 1:2])
    second, _ = ref(x[2:, 1:2])
    torch.testing.assert_close(y[:, 1:2], torch.cat([first, second]), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(y[2:, 1], whole[2:, 1], atol=1e-4)  # the reset did change something


def test_rnn_equals_torch_rnn_then_output_layer(build):
    net = build(RNN_XC, x=(T, N, 3), cont=(T, N))
    w_xh, b_h, w_hh, w_ho, b_o = _random_rnn_blobs(3)
    set_blobs(net, "rec", w_xh, b_h, w_hh, w_ho, b_o)
    x, cont = torch.randn(T, N, 3), _cont()
    cont[3, 0] = 0
    y = net(x=x, cont=cont)
    ref = torch.nn.RNN(3, H, nonlinearity="tanh")
    with torch.no_grad():
        ref.weight_ih_l0.copy_(w_xh), ref.bias_ih_l0.copy_(b_h), ref.weight_hh_l0.copy_(w_hh)
        ref.bias_hh_l0.zero_()
    h, _ = ref(x)
    h0a, _ = ref(x[:3, :1])
    h0b, _ = ref(x[3:, :1])
    h[:, :1] = torch.cat([h0a, h0b])  # sample 0 restarts at t = 3
    torch.testing.assert_close(y, torch.tanh(F.linear(h, w_ho, b_o)), atol=1e-5, rtol=1e-5)


def test_lstm_static_input_by_hand_for_two_steps(build):
    layer = _layer("LSTM", 'bottom: "x" bottom: "cont" bottom: "xs"')
    net = build(layer, x=(2, N, 3), cont=(2, N), xs=(N, 2, 1))
    w_xc, b_c, w_s, w_hc = _random_lstm_blobs(3, 2)
    set_blobs(net, "rec", w_xc, b_c, w_s, w_hc)
    x, xs = torch.randn(2, N, 3), torch.randn(N, 2, 1)
    y = net(x=x, cont=_cont(2), xs=xs)
    static = F.linear(xs.reshape(N, 2), w_s)  # no bias on the static transform

    def gate(pre, k):  # block k of Caffe's i, f, o, g
        return pre[:, k * H : (k + 1) * H]

    pre0 = F.linear(x[0], w_xc, b_c) + static  # h_{-1} is zero (and cont_0 = 0)
    c0 = torch.sigmoid(gate(pre0, 0)) * torch.tanh(gate(pre0, 3))
    h0 = torch.sigmoid(gate(pre0, 2)) * torch.tanh(c0)
    pre1 = F.linear(x[1], w_xc, b_c) + static + F.linear(h0, w_hc)
    c1 = torch.sigmoid(gate(pre1, 1)) * c0 + torch.sigmoid(gate(pre1, 0)) * torch.tanh(gate(pre1, 3))
    h1 = torch.sigmoid(gate(pre1, 2)) * torch.tanh(c1)
    torch.testing.assert_close(y, torch.stack([h0, h1]), atol=1e-5, rtol=1e-5)


def test_static_input_equals_features_appended_to_every_step(build):
    # An independent reference: W_x x_t + W_s s == [W_x | W_s] [x_t; s], which torch.nn.LSTM/RNN take.
    x, xs, cont = torch.randn(T, N, 3), torch.randn(N, 2), _cont()
    wide = torch.cat([x, xs.expand(T, N, 2)], dim=2)
    net = build(
        _layer("LSTM", 'bottom: "x" bottom: "cont" bottom: "xs"'), x=(T, N, 3), cont=(T, N), xs=(N, 2)
    )
    w_xc, b_c, w_s, w_hc = _random_lstm_blobs(3, 2)
    set_blobs(net, "rec", w_xc, b_c, w_s, w_hc)
    expected, _ = _torch_lstm(torch.cat([w_xc, w_s], dim=1), b_c, w_hc)(wide)
    torch.testing.assert_close(net(x=x, cont=cont, xs=xs), expected, atol=1e-5, rtol=1e-5)

    net = build(_layer("RNN", 'bottom: "x" bottom: "cont" bottom: "xs"'), x=(T, N, 3), cont=(T, N), xs=(N, 2))
    w_xh, b_h, w_s, w_hh, w_ho, b_o = _random_rnn_blobs(3, 2)
    set_blobs(net, "rec", w_xh, b_h, w_s, w_hh, w_ho, b_o)
    ref = torch.nn.RNN(5, H)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.cat([w_xh, w_s], dim=1)), ref.bias_ih_l0.copy_(b_h)
        ref.weight_hh_l0.copy_(w_hh), ref.bias_hh_l0.zero_()
    expected = torch.tanh(F.linear(ref(wide)[0], w_ho, b_o))
    torch.testing.assert_close(net(x=x, cont=cont, xs=xs), expected, atol=1e-5, rtol=1e-5)


def test_lstm_expose_hidden_takes_and_returns_the_states(build):
    layer = _layer(
        "LSTM",
        'bottom: "x" bottom: "cont" bottom: "h0" bottom: "c0"',
        'top: "y" top: "hT" top: "cT"',
        "expose_hidden: true",
    )
    net = build(layer, x=(T, N, 2), cont=(T, N), h0=(1, N, H), c0=(1, N, H))
    assert [net.blob_shapes[k] for k in ("y", "hT", "cT")] == [(T, N, H), (1, N, H), (1, N, H)]
    blobs = _random_lstm_blobs(2)
    set_blobs(net, "rec", *blobs)
    x, h0, c0 = torch.randn(T, N, 2), torch.randn(1, N, H), torch.randn(1, N, H)
    out = net(x=x, cont=torch.ones(T, N), h0=h0, c0=c0)  # cont_0 = 1: the given states are used
    expected, (h_n, c_n) = _torch_lstm(*blobs)(x, (h0, c0))
    for got, want in ((out["y"], expected), (out["hT"], h_n), (out["cT"], c_n)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # With cont_0 = 0 the given states are ignored, as if they were zeros.
    zeros = net(x=x, cont=_cont(), h0=torch.zeros(1, N, H), c0=torch.zeros(1, N, H))
    torch.testing.assert_close(net(x=x, cont=_cont(), h0=h0, c0=c0)["y"], zeros["y"])


def test_rnn_expose_hidden_with_static_input(build):
    layer = _layer(
        "RNN",
        'bottom: "x" bottom: "cont" bottom: "xs" bottom: "h0"',
        'top: "y" top: "hT"',
        "expose_hidden: true",
    )
    net = build(layer, x=(T, N, 2), cont=(T, N), xs=(N, 1), h0=(1, N, H))
    w_xh, b_h, w_s, w_hh, w_ho, b_o = _random_rnn_blobs(2, 1)
    set_blobs(net, "rec", w_xh, b_h, w_s, w_hh, w_ho, b_o)
    x, xs, h0 = torch.randn(T, N, 2), torch.randn(N, 1), torch.randn(1, N, H)
    out = net(x=x, cont=torch.ones(T, N), xs=xs, h0=h0)
    ref = torch.nn.RNN(3, H)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.cat([w_xh, w_s], dim=1)), ref.bias_ih_l0.copy_(b_h)
        ref.weight_hh_l0.copy_(w_hh), ref.bias_hh_l0.zero_()
    h, h_n = ref(torch.cat([x, xs.expand(T, N, 1)], dim=2), h0)
    torch.testing.assert_close(out["y"], torch.tanh(F.linear(h, w_ho, b_o)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["hT"], h_n, atol=1e-5, rtol=1e-5)  # the hidden state, not o_T


def test_blob_names_shapes_and_fillers(build):
    cases = [
        ("LSTM", "", ["W_xc", "b_c", "W_hc"], [(4 * H, 6), (4 * H,), (4 * H, H)]),
        (
            "LSTM",
            "xs",
            ["W_xc", "b_c", "W_xc_x_static", "W_hc"],
            [(4 * H, 6), (4 * H,), (4 * H, 10), (4 * H, H)],
        ),
        ("RNN", "", ["W_xh", "b_h", "W_hh", "W_ho", "b_o"], [(H, 6), (H,), (H, H), (H, H), (H,)]),
        (
            "RNN",
            "xs",
            ["W_xh", "b_h", "W_xh_x_static", "W_hh", "W_ho", "b_o"],
            [(H, 6), (H,), (H, 10), (H, H), (H, H), (H,)],
        ),
    ]
    for kind, static, names, shapes in cases:
        bottoms = 'bottom: "x" bottom: "cont"' + (' bottom: "xs"' if static else "")
        inputs = {"x": (T, N, 2, 3), "cont": (T, N)} | ({"xs": (N, 2, 5)} if static else {})
        net = build(_layer(kind, bottoms, extra='weight_filler { type: "gaussian" std: 0.1 }'), **inputs)
        assert net.layers["rec"].blob_names == tuple(names)
        blobs = net.blobs_of("rec")
        assert [tuple(b.shape) for b in blobs] == shapes
        for name, blob in zip(names, blobs):  # weights drawn, biases at Caffe's default constant 0
            assert bool((blob == 0).all()) == name.startswith("b_"), (kind, name)
        assert net.blob_shapes["y"] == (T, N, H)
    net = build(
        _layer("LSTM", 'bottom: "x" bottom: "cont"', extra='bias_filler { type: "constant" value: 1 }'),
        x=(T, N, 2),
        cont=(T, N),
    )
    w_xc, b_c, w_hc = net.blobs_of("rec")
    assert bool((w_xc == 0).all() and (w_hc == 0).all() and (b_c == 1).all())


NET = """
name: "tiny_lstm"
layer { name: "input" type: "Input" top: "x" top: "cont"
        input_param { shape { dim: 4 dim: 2 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        param { lr_mult: 1 } param { lr_mult: 2 } param { lr_mult: 0.5 }
        recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.3 max: 0.3 }
                          bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "h" top: "score"
        inner_product_param { num_output: 2 axis: 2 weight_filler { type: "xavier" } } }
"""


def test_in_a_net_with_param_specs_and_a_caffemodel_round_trip(tmp_path):
    torch.manual_seed(1)
    trained = load_net(NET, phase="TEST")
    assert trained.caffe_layers == [("input", "Input"), ("lstm1", "LSTM"), ("ip", "InnerProduct")]
    assert trained.blob_shapes["h"] == (4, 2, 5) and trained.blob_shapes["score"] == (4, 2, 2)
    params = [(name, lr) for name, _, lr, _ in trained.learnable_params()]
    assert params[:3] == [("layers.lstm1.W_xc", 1.0), ("layers.lstm1.b_c", 2.0), ("layers.lstm1.W_hc", 0.5)]
    x, cont = torch.randn(4, 2, 3), _cont(4, 2)
    out = trained(x=x, cont=cont)
    out.sum().backward()  # gradients reach every blob
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p, _, _ in trained.learnable_params())

    fresh = load_net(NET, phase="TEST")
    assert not torch.allclose(fresh(x=x, cont=cont), out)
    path = save_weights(trained, tmp_path / "lstm.caffemodel")
    summary = load_weights(fresh, path)
    assert summary.loaded == ("lstm1", "ip")
    torch.testing.assert_close(fresh(x=x, cont=cont), out.detach(), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("text", "shapes", "needle"),
    [
        (
            'layer { name: "rec" type: "LSTM" bottom: "x" bottom: "cont" top: "y" recurrent_param { } }',
            {"x": (T, N, 2), "cont": (T, N)},
            "num_output is required",
        ),
        (
            _layer("LSTM", 'bottom: "x" bottom: "cont"').replace(f"num_output: {H}", "num_output: 0"),
            {"x": (T, N, 2), "cont": (T, N)},
            "num_output must be positive",
        ),
        (LSTM_XC, {"x": (T, N, 2), "cont": (T, N + 1)}, f"must have shape [T, N] = [{T}, {N}]"),
        (LSTM_XC, {"x": (T, N, 2), "cont": (T, N, 1)}, "continuation indicators"),
        (RNN_XC, {"x": (T, N), "cont": (T, N)}, "at least 3 axes"),
        (_layer("RNN", 'bottom: "x"'), {"x": (T, N, 2)}, "needs 2 to 3 bottom blob(s), got 1"),
        (
            _layer("RNN", 'bottom: "x" bottom: "cont" bottom: "xs"'),
            {"x": (T, N, 2), "cont": (T, N), "xs": (N + 1, 2)},
            "static input 'xs'",
        ),
        (
            _layer(
                "LSTM",
                'bottom: "x" bottom: "cont" bottom: "h0"',
                'top: "y" top: "hT" top: "cT"',
                "expose_hidden: true",
            ),
            {"x": (T, N, 2), "cont": (T, N), "h0": (1, N, H)},
            "needs 4 to 5 bottom",
        ),
        (
            _layer(
                "LSTM",
                'bottom: "x" bottom: "cont" bottom: "h0" bottom: "c0"',
                'top: "y" top: "hT" top: "cT"',
                "expose_hidden: true",
            ),
            {"x": (T, N, 2), "cont": (T, N), "h0": (1, N, H), "c0": (N, H)},
            "initial state c_0 (bottom 'c0')",
        ),
        (
            _layer("RNN", 'bottom: "x" bottom: "cont" bottom: "h0"', 'top: "y"', "expose_hidden: true"),
            {"x": (T, N, 2), "cont": (T, N), "h0": (1, N, H)},
            "needs 2 top blob(s), got 1",
        ),
    ],
)
def test_bad_configurations_name_the_layer(build, text, shapes, needle):
    with pytest.raises(ConfigError) as err:
        build(text, **shapes)
    message = str(err.value)
    assert "layer 'rec'" in message and needle in message, message


def test_cont_shape_is_checked_when_running(build):
    net = build(LSTM_XC, x=(T, N, 2), cont=(T, N))
    with pytest.raises(ValueError, match="layer 'rec'.*cont must have shape"):
        net(x=torch.randn(T, N, 2), cont=torch.ones(T, N + 1))
    assert net(x=torch.randn(7, 1, 2), cont=_cont(7, 1)).shape == (7, 1, H)  # other T and N run too


def test_lstm_unit_is_one_torch_lstm_cell_step(build):
    net = build(
        'layer { name: "u" type: "LSTMUnit" bottom: "c0" bottom: "x" bottom: "cont" top: "c" top: "h" }',
        c0=(1, 3, 4),
        x=(1, 3, 16),
        cont=(1, 3),
    )
    c0, gates = torch.randn(1, 3, 4), torch.randn(1, 3, 16)
    # torch.nn.LSTMCell fed the gates as its input through a permutation (Caffe i,f,o,g -> torch i,f,g,o)
    cell = torch.nn.LSTMCell(16, 4, bias=False)
    order = torch.cat([torch.arange(0, 8), torch.arange(12, 16), torch.arange(8, 12)])
    with torch.no_grad():
        cell.weight_ih.copy_(torch.eye(16)[order])
        cell.weight_hh.zero_()
    h_ref, c_ref = cell(gates[0], (torch.zeros(3, 4), c0[0]))
    out = net(c0, gates, torch.ones(1, 3))
    torch.testing.assert_close(out["c"][0], c_ref)
    torch.testing.assert_close(out["h"][0], h_ref)
    i, _, _, g = gates[0].chunk(4, dim=1)
    reset = net(c0, gates, torch.tensor([[0.0, 1.0, 0.0]]))  # cont 0 drops c_prev
    torch.testing.assert_close(reset["c"][0, 0], torch.sigmoid(i[0]) * torch.tanh(g[0]))
