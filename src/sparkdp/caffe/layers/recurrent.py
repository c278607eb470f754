"""RNN and LSTM (``recurrent_layer.cpp``, ``rnn_layer.cpp``, ``lstm_layer.cpp``): time-major recurrences.

Bottoms are ``x`` ``(T, N, ...)`` (features flattened from axis 2), ``cont`` ``(T, N)`` (0 where a
sequence starts, else 1: the previous state is multiplied by it, so a 0 resets the state), an
optional static input ``(N, ...)`` added to every step's pre-activation, and with
``expose_hidden: true`` the initial states (``h_0`` and for LSTM ``c_0``, each ``(1, N, H)``),
whose final values become extra tops.  The top is ``(T, N, num_output)``.

LSTM: ``gates = W_xc x_t + b_c + W_hc (cont_t h_{t-1}) [+ W_xc_x_static x_static]``, split as
i, f, o, g; ``c_t = cont_t f c_{t-1} + i g``, ``h_t = o tanh(c_t)``.  RNN:
``h_t = tanh(W_xh x_t + b_h + W_hh (cont_t h_{t-1}) [+ W_xh_x_static x_static])``, top
``o_t = tanh(W_ho h_t + b_o)``.  A ``.caffemodel`` stores the blobs in the order of
:attr:`blob_names` with Caffe's gate blocks, i, f, o, g along the 4H rows, whereas
``torch.nn.LSTM`` uses i, f, g, o: reordering the rows silently changes the model without
any shape error, so weights here stay in Caffe's order and the step splits them as Caffe does.

Unlike Caffe, which copies the final state into the next forward call's initial state when
``expose_hidden`` is false, every forward here starts from zeros (only visible when a batch's
first ``cont`` is 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import DataError
from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    converter,
    count,
    expect_bottoms,
    expect_tops,
    fail,
    flag,
    integer,
)
from .fillers import fill_blobs


class _Recurrent(CaffeLayer):
    """Shared input handling and blobs; subclasses list their blobs and define :meth:`_run`."""

    state_names: tuple[str, ...] = ()
    #: Caffe's blob order: (name, rows in units of ``hidden``, columns: the input ``d``, the static
    #: input's (blob only with a static input), ``hidden``, or none for a bias)
    blobs: tuple[tuple[str, int, str], ...] = ()

    config = ("hidden", "static", "expose", "who")
    hidden: int
    static: bool
    expose: bool
    who: str

    def __init__(self, d: int, hidden: int, d_static: int | None, expose: bool, who: str) -> None:
        super().__init__(hidden, d_static is not None, expose, who)
        columns = {"d": d, "static": d_static or 0, "hidden": hidden}
        for name, rows, column in self.blobs:
            if column != "static" or d_static is not None:
                shape = (rows * hidden, columns[column]) if column else (rows * hidden,)
                setattr(self, name, nn.Parameter(torch.zeros(shape)))
                self.blob_names += (name,)

    def forward(self, x: torch.Tensor, cont: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        steps, batch = x.shape[0], x.shape[1]
        if tuple(cont.shape) != (steps, batch):
            raise DataError(
                f"{self.who}: cont must have shape [T, N] = {[steps, batch]} like x's first two axes; "
                f"got {list(cont.shape)}"
            )
        xs = x.flatten(2)
        cont = cont.detach().to(xs.dtype).unsqueeze(-1)  # Caffe never backpropagates to cont
        static = rest[0].flatten(1) if self.static else None
        if self.expose:
            states = [s[0] for s in rest[int(self.static) :]]
        else:
            states = [xs.new_zeros(batch, self.hidden) for _ in self.state_names]
        return self._run(xs, cont, static, states)

    def _run(
        self, xs: torch.Tensor, cont: torch.Tensor, static: torch.Tensor | None, states: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def _tops(self, outs: list[torch.Tensor], xs: torch.Tensor, finals: list[torch.Tensor]) -> tuple:
        top = torch.stack(outs) if outs else xs.new_zeros(0, xs.shape[1], self.hidden)
        return (top, *(s.unsqueeze(0) for s in finals)) if self.expose else (top,)


class LSTM(_Recurrent):
    state_names = ("h_0", "c_0")
    blobs = (("W_xc", 4, "d"), ("b_c", 4, ""), ("W_xc_x_static", 4, "static"), ("W_hc", 4, "hidden"))

    def _run(self, xs, cont, static, states):
        w = dict(zip(self.blob_names, self.caffe_blobs()))
        pre = F.linear(xs, w["W_xc"], w["b_c"])  # every step's input transform in one product
        if static is not None:
            pre = pre + F.linear(static, w["W_xc_x_static"])
        h, c = states
        outs = []
        for t in range(xs.shape[0]):
            gates = pre[t] + F.linear(cont[t] * h, w["W_hc"])
            i, f, o, g = gates.chunk(4, dim=-1)  # Caffe's block order: input, forget, output, cell
            c = cont[t] * (torch.sigmoid(f) * c) + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return self._tops(outs, xs, [h, c])


class RNN(_Recurrent):
    state_names = ("h_0",)
    blobs = (
        ("W_xh", 1, "d"),
        ("b_h", 1, ""),
        ("W_xh_x_static", 1, "static"),
        ("W_hh", 1, "hidden"),
        ("W_ho", 1, "hidden"),
        ("b_o", 1, ""),
    )

    def _run(self, xs, cont, static, states):
        w = dict(zip(self.blob_names, self.caffe_blobs()))
        pre = F.linear(xs, w["W_xh"], w["b_h"])
        if static is not None:
            pre = pre + F.linear(static, w["W_xh_x_static"])
        (h,) = states
        hs = []
        for t in range(xs.shape[0]):
            h = torch.tanh(pre[t] + F.linear(cont[t] * h, w["W_hh"]))
            hs.append(h)
        outs = list(torch.tanh(F.linear(torch.stack(hs), w["W_ho"], w["b_o"]))) if hs else []
        return self._tops(outs, xs, [h])


def _build(layer: LayerSpec, shapes: list[Shape], cls: type[_Recurrent]) -> Built:
    p = layer.sub("recurrent_param")
    hidden = integer(layer, p, "num_output")
    if hidden <= 0:
        raise fail(layer, f"num_output must be positive; got {hidden}")
    expose = flag(layer, p, "expose_hidden", False)
    n_states = len(cls.state_names) if expose else 0
    expect_bottoms(layer, shapes, 2 + n_states, 3 + n_states)
    expect_tops(layer, 1 + n_states)
    x, cont = shapes[0], shapes[1]
    if len(x) < 3:
        raise fail(
            layer, f"bottom {layer.bottoms[0]!r} must be [T, N, features...] (at least 3 axes); got {list(x)}"
        )
    steps, batch = x[0], x[1]
    if tuple(cont) != (steps, batch):
        raise fail(
            layer,
            f"bottom {layer.bottoms[1]!r} (the sequence continuation indicators) must have shape "
            f"[T, N] = {[steps, batch]} matching bottom {layer.bottoms[0]!r}; got {list(cont)}",
        )
    static = len(shapes) > 2 + n_states
    d_static = None
    if static:
        s = shapes[2]
        if len(s) < 2 or s[0] != batch:
            raise fail(
                layer,
                f"static input {layer.bottoms[2]!r} must be [N, features...] with N = {batch}; got {list(s)}",
            )
        d_static = count(s, 1)
    state_shape = (1, batch, hidden)
    if expose:
        for name, bottom, shape in zip(
            cls.state_names, layer.bottoms[2 + static :], shapes[2 + static :], strict=True
        ):
            if tuple(shape) != state_shape:
                raise fail(
                    layer,
                    f"initial state {name} (bottom {bottom!r}) must have shape {list(state_shape)}; "
                    f"got {list(shape)}",
                )
    module = cls(count(x, 2), hidden, d_static, expose, layer.describe())
    fill_blobs(layer, module, p)
    tops: list[Shape] = [(steps, batch, hidden)]
    return Built(module, tops + [state_shape] * n_states)


@converter("LSTM")
def lstm(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    return _build(layer, shapes, LSTM)


@converter("RNN")
def rnn(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    return _build(layer, shapes, RNN)


class LSTMUnit(CaffeLayer):
    """One LSTM step on precomputed gates (``lstm_unit_layer.cpp``), the cell LSTM unrolls into.

    Bottoms ``c_prev`` (1, N, H), gates ``X`` (1, N, 4H) in Caffe's i, f, o, g order and
    ``cont`` (1, N); tops ``c = cont·f·c_prev + i·g`` and ``h = o·tanh(c)``.
    """

    def forward(
        self, c_prev: torch.Tensor, gates: torch.Tensor, cont: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        i, f, o, g = gates.chunk(4, dim=-1)
        c = cont.reshape(*c_prev.shape[:-1], 1) * torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
        return c, torch.sigmoid(o) * torch.tanh(c)


@converter("LSTMUnit", bottoms=3, tops=2)
def lstm_unit(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    c_prev, gates, cont = shapes
    if len(c_prev) != 3 or c_prev[0] != 1 or gates != (*c_prev[:2], 4 * c_prev[2]) or cont != c_prev[:2]:
        raise fail(
            layer,
            f"needs c_prev (1, N, H), gates (1, N, 4H) and cont (1, N); got {list(c_prev)}, {list(gates)} and "
            f"{list(cont)}",
        )
    return Built(LSTMUnit(), [c_prev, c_prev])
