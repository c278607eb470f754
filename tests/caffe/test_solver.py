"""SolverParameter parsing: Caffe defaults, upgrades, validation, snapshot names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparkdp.caffe.optim import CaffeAdam, CaffeNesterov, CaffeSGD
from sparkdp.caffe.solver import SolverSpec, load_solver, read_solver_spec
from sparkdp.caffe.textformat import parse
from sparkdp.errors import ConfigError

SHARED = Path("/work/shared/caffe")


def test_lenet_solver_file():
    s = read_solver_spec(SHARED / "lenet_solver.prototxt")
    assert s.net == "examples/mnist/lenet_train_test.prototxt"
    assert s.test_iter == (100,) and s.test_interval == 500
    assert (s.base_lr, s.momentum, s.weight_decay) == (0.01, 0.9, 0.0005)
    assert (s.lr_policy, s.gamma, s.power) == ("inv", 0.0001, 0.75)
    assert (s.display, s.max_iter, s.snapshot) == (100, 10000, 5000)
    assert s.snapshot_prefix == "examples/mnist/lenet"
    assert s.solver_mode == "GPU"
    # Caffe defaults for everything the file leaves out.
    assert (s.type, s.iter_size, s.clip_gradients, s.regularization_type) == ("SGD", 1, -1.0, "L2")
    assert (s.delta, s.momentum2, s.rms_decay, s.average_loss) == (1e-8, 0.999, 0.99, 1)
    assert s.test_initialization is True and s.snapshot_format == "BINARYPROTO"


def test_cifar10_quick_solver_file():
    s = read_solver_spec(str(SHARED / "cifar10_quick_solver.prototxt"))
    assert (s.base_lr, s.momentum, s.weight_decay, s.lr_policy) == (0.001, 0.9, 0.004, "fixed")
    assert (s.max_iter, s.snapshot, s.display, s.test_interval) == (4000, 4000, 100, 500)
    assert s.snapshot_prefix == "examples/cifar10/cifar10_quick"


def test_solver_object_exposes_the_loop_settings(tmp_path):
    w = torch.nn.Parameter(torch.zeros(2))
    solver = load_solver(SHARED / "lenet_solver.prototxt", [w])
    assert isinstance(solver.optimizer, CaffeSGD)
    assert (solver.max_iter, solver.test_interval, solver.test_iter) == (10000, 500, (100,))
    assert (solver.snapshot, solver.display, solver.iter) == (5000, 100, 0)
    assert solver.snapshot_path(5000) == Path("examples/mnist/lenet_iter_5000.caffemodel")
    assert solver.lr_at(5000) == pytest.approx(0.0073778795, abs=1e-9)
    assert solver.rate == pytest.approx(0.01)
    assert solver.test_due(0) and solver.test_due(500) and not solver.test_due(499)
    assert solver.snapshot_due(5000) and not solver.snapshot_due(0)


def test_default_snapshot_prefix_is_the_solver_path_without_extension(tmp_path):
    path = tmp_path / "my_solver.prototxt"
    path.write_text('base_lr: 0.1 lr_policy: "fixed"')
    assert read_solver_spec(path).snapshot_prefix == str(tmp_path / "my_solver")
    (tmp_path / "snaps").mkdir()
    path.write_text(f'base_lr: 0.1 lr_policy: "fixed" snapshot_prefix: "{tmp_path / "snaps"}"')
    assert read_solver_spec(path).snapshot_prefix == str(tmp_path / "snaps" / "my_solver")


def test_write_snapshot_uses_caffe_naming(tmp_path):
    class Net(torch.nn.Module):
        caffe_layers = [("ip", "InnerProduct")]

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2, 3))

        def blobs_of(self, name):
            return [self.w]

    net = Net()
    solver = load_solver(f'base_lr: 0.1 lr_policy: "fixed" snapshot_prefix: "{tmp_path}/out/net"', net)
    net.w.grad = torch.ones(2, 3)
    solver.step()
    path = solver.write_snapshot(net)
    assert path == tmp_path / "out" / "net_iter_1.caffemodel" and path.is_file()


@pytest.mark.parametrize(
    "text, type_name, cls",
    [
        ('lr_policy: "fixed" solver_type: NESTEROV momentum: 0.9', "Nesterov", CaffeNesterov),
        ('lr_policy: "fixed" solver_type: 5', "Adam", CaffeAdam),
        ('lr_policy: "fixed" type: "Adam"', "Adam", CaffeAdam),
    ],
)
def test_v1_solver_type_is_upgraded(text, type_name, cls):
    assert read_solver_spec(text).type == type_name
    assert isinstance(load_solver(text, [torch.nn.Parameter(torch.zeros(1))]).optimizer, cls)


@pytest.mark.parametrize(
    "text, message",
    [
        ('lr_policy: "fixed" solver_type: SGD type: "SGD"', "both the old `solver_type`"),
        ('lr_policy: "fixed" momentun: 0.9', "unknown solver field 'momentun'. Did you mean 'momentum'"),
        ('lr_policy: "fixed" base_lr: 0.1 base_lr: 0.2', "given 2 times"),
        ('lr_policy: "fixed" base_lr: "fast"', "'base_lr' needs a number; received 'fast'"),
        ('lr_policy: "fixed" max_iter: 1.5', "'max_iter' needs an integer"),
        ('lr_policy: "fixed" solver_mode: TPU', "one of CPU, GPU"),
        ('lr_policy: "fixed" type: "sgd"', "Did you mean 'SGD'"),
        ('lr_policy: "fixed" type: "AdaGrad" momentum: 0.9', "momentum cannot be used with AdaGrad"),
        ('lr_policy: "fixed" type: "RMSProp" momentum: 0.9', "momentum cannot be used with RMSProp"),
        ('lr_policy: "fixed" regularization_type: "L3"', "allowed: L2, L1"),
        ('lr_policy: "step"', "stepsize > 0"),
        ('lr_policy: "poly" power: 1', "max_iter > 0"),
        ('lr_policy: "fixed" iter_size: 0', "iter_size must be >= 1"),
        ('lr_policy: "fixed" test_iter: 100', "test_interval"),
        ('lr_policy: "fixed" net: "a" train_net: "b"', "more than one train net"),
        ('lr_policy: "linear"', "allowed: fixed, step"),
    ],
)
def test_invalid_solvers_raise_clear_errors(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("`", "`")):
        read_solver_spec(text)


def test_message_and_spec_inputs():
    msg = parse('base_lr: 0.5 lr_policy: "multistep" gamma: 0.1 stepvalue: 10 stepvalue: 20')
    s = read_solver_spec(msg)
    assert s.stepvalue == (10, 20) and s.base_lr == 0.5
    assert read_solver_spec(s) is s
    assert SolverSpec.from_message(msg) == s


def test_missing_file_is_reported():
    with pytest.raises(ConfigError, match="neither an existing file nor solver text"):
        read_solver_spec("no/such/solver.prototxt")


def test_bad_params_argument():
    with pytest.raises(ConfigError, match="cannot take parameters from a int"):
        load_solver('lr_policy: "fixed"', 3)


def test_lenet_solver_over_the_real_net_uses_lr_mult_from_the_prototxt():
    net_module = pytest.importorskip("sparkdp.caffe.net", reason="sparkdp.caffe.net is not available yet")
    net = net_module.load_net(
        SHARED / "lenet_train_test.prototxt", phase="TRAIN", input_shapes={"data": (2, 1, 28, 28)}
    )
    solver = load_solver(SHARED / "lenet_solver.prototxt", net)
    weight, bias = net.blobs_of("ip2")
    w0, b0 = weight.detach().clone(), bias.detach().clone()
    solver.zero_grad()
    net.loss(net(data=torch.rand(2, 1, 28, 28), label=torch.tensor([1.0, 7.0]))).backward()
    gw, gb = weight.grad.clone(), bias.grad.clone()
    solver.step()
    # ip2: weights lr_mult 1, biases lr_mult 2; decay_mult 1 (default), weight_decay 0.0005, rate 0.01.
    torch.testing.assert_close(weight.detach(), w0 - 0.01 * (gw + 0.0005 * w0))
    torch.testing.assert_close(bias.detach(), b0 - 0.02 * (gb + 0.0005 * b0))
    assert solver.iter == 1 and solver.rate == pytest.approx(0.01 * (1 + 1e-4) ** -0.75, rel=1e-6)
