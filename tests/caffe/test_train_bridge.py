"""The bridge from a Caffe net + solver to sparkdp's training loop (no Spark)."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparkdp.caffe.classifier import CaffeClassifier
from sparkdp.caffe.net import load_net
from sparkdp.caffe.solver import CaffeOptimizerFactory, read_solver_spec
from sparkdp.caffe.train import effective_batch_size, plan_epochs, solver_net_source
from sparkdp.caffe.weights import load_weights, save_weights
from sparkdp.errors import ConfigError

SHARED = Path("/work/shared/caffe")
EXAMPLES = Path(__file__).parent / "data"


def _example(name: str) -> Path:
    for root in (EXAMPLES, SHARED):
        if (root / name).is_file():
            return root / name
    pytest.skip(f"{name} is not available")


@pytest.fixture
def lenet_path() -> Path:
    return _example("lenet_train_test.prototxt")


@pytest.fixture
def solver_spec():
    return read_solver_spec(_example("lenet_solver.prototxt"))


@pytest.fixture
def lenet(lenet_path) -> CaffeClassifier:
    torch.manual_seed(0)
    return CaffeClassifier(lenet_path, sample_shape=(1, 28, 28), raw_scale=255.0)


# A tiny net: Data layer with a transform, one InnerProduct, a weighted loss with ignore_label.
TINY = """
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.5 mean_value: 10 } data_param { source: "x" batch_size: 8 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        data_param { source: "y" batch_size: 4 } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "acc" type: "Accuracy" bottom: "fc" bottom: "label" top: "acc" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" loss_weight: 2
        loss_param { ignore_label: 1 } }
"""


def _copy_weights(src, dst) -> None:
    with torch.no_grad():
        for name, _ in src.caffe_layers:
            for a, b in zip(src.blobs_of(name), dst.blobs_of(name), strict=True):
                b.copy_(a)


def test_wrapper_returns_the_nets_own_prediction_blob(lenet, lenet_path):
    torch.manual_seed(1)
    x = torch.randint(0, 256, (4, 1, 28, 28)).float() / 255.0  # sparkdp's [0, 1] images
    y = torch.randint(0, 10, (4,))
    net = load_net(lenet_path, phase="TRAIN", input_shapes={"data": (4, 1, 28, 28)})
    _copy_weights(lenet, net)
    seen = {}
    net.layers["ip2"].register_forward_hook(lambda _m, _i, out: seen.update(ip2=out[0]))
    caffe_data = x * 255.0 * 0.00390625  # Caffe's Data layer: raw pixels x transform_param scale
    net_loss = net.loss(net(data=caffe_data, label=y.float()))

    logits = lenet(x)
    assert lenet.prediction_blob == "ip2" and lenet.data_blob == "data" and lenet.label_blob == "label"
    assert logits.shape == (4, 10)
    torch.testing.assert_close(logits, seen["ip2"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lenet.caffe_loss()(logits, y), net_loss, rtol=1e-5, atol=1e-6)


def test_wrapper_reports_caffe_view_of_lenet(lenet):
    assert lenet.batch_size == 64  # the TRAIN Data layer's batch_size
    names = [name for name, _ in lenet.caffe_layers]
    assert names == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"]
    assert [tuple(t.shape) for t in lenet.blobs_of("ip2")] == [(10, 500), (10,)]


def test_caffe_loss_is_cross_entropy_for_softmax_with_loss(lenet):
    torch.manual_seed(2)
    logits = torch.randn(7, 10, requires_grad=True)
    labels = torch.randint(0, 10, (7,))
    loss = lenet.caffe_loss()(logits, labels)
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels))
    loss.backward()
    expected = torch.autograd.grad(F.cross_entropy(logits, labels), logits)[0]
    torch.testing.assert_close(logits.grad, expected)


def test_caffe_loss_keeps_ignore_label_and_loss_weight():
    model = CaffeClassifier(TINY, sample_shape=(5,))
    logits = torch.randn(6, 3)
    labels = torch.tensor([0, 1, 2, 1, 0, 2])
    expected = 2.0 * F.cross_entropy(logits, labels, ignore_index=1)  # VALID: mean over non-ignored rows
    torch.testing.assert_close(model.caffe_loss()(logits, labels), expected)
    restored = pickle.loads(pickle.dumps(model.caffe_loss()))
    torch.testing.assert_close(restored(logits, labels), expected)


def test_transform_param_scale_and_mean_are_applied():
    torch.manual_seed(3)
    model = CaffeClassifier(TINY, sample_shape=(5,), raw_scale=255.0)
    x = torch.rand(2, 5)
    weight, bias = model.blobs_of("fc")
    expected = ((x * 255.0 - 10.0) * 0.5) @ weight.T + bias
    torch.testing.assert_close(model(x), expected)
    assert model.batch_size == 8


def test_optimizer_factory_rebuilds_lr_mult_groups_on_a_copy(lenet, solver_spec):
    factory = pickle.loads(pickle.dumps(CaffeOptimizerFactory(solver_spec, lenet)))
    worker_copy = copy.deepcopy(lenet)
    optimizer = factory(list(worker_copy.parameters()))
    groups = {g["lr_mult"]: g for g in optimizer.param_groups}
    assert set(groups) == {1.0, 2.0}
    copy_params = {id(p) for p in worker_copy.parameters()}
    assert all(id(p) in copy_params for g in optimizer.param_groups for p in g["params"])
    biases = [p for p in groups[2.0]["params"]]
    assert len(biases) == 4 and all(p.dim() == 1 for p in biases)  # conv1, conv2, ip1, ip2 biases
    assert all(p.dim() > 1 for p in groups[1.0]["params"])
    expected_biases = [worker_copy.blobs_of(name)[1] for name in ("conv1", "conv2", "ip1", "ip2")]
    assert [id(p) for p in biases] == [id(p) for p in expected_biases]
    assert all(
        g["weight_decay"] == pytest.approx(5e-4) and g["momentum"] == pytest.approx(0.9)
        for g in optimizer.param_groups
    )
    assert type(optimizer).__name__ == "CaffeSGD"


def test_optimizer_factory_keeps_decay_mult():
    model = CaffeClassifier(TINY, sample_shape=(5,))
    spec = read_solver_spec('base_lr: 0.1 lr_policy: "fixed" weight_decay: 0.01')
    optimizer = CaffeOptimizerFactory(spec, model)(list(model.parameters()))
    assert sorted((g["lr_mult"], g["decay_mult"]) for g in optimizer.param_groups) == [(1.0, 1.0), (2.0, 0.0)]


def test_optimizer_factory_refuses_another_model(lenet, solver_spec):
    factory = CaffeOptimizerFactory(solver_spec, lenet)
    with pytest.raises(ConfigError, match="8 parameter tensors, but got 2"):
        factory(list(torch.nn.Linear(3, 2).parameters()))


def _inv(spec, it: int) -> float:
    return spec.base_lr * (1.0 + spec.gamma * it) ** (-spec.power)


def test_schedule_follows_inv_policy_step_by_step(lenet, solver_spec):
    optimizer = CaffeOptimizerFactory(solver_spec, lenet)(list(lenet.parameters()))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([1, 2])
    loss_fn = lenet.caffe_loss()
    for k in range(1, 4):
        optimizer.zero_grad()
        loss_fn(lenet(x), y).backward()
        optimizer.step()
        assert all(g["caffe_iter"] == k for g in optimizer.param_groups)
        assert all(g["lr"] == pytest.approx(_inv(solver_spec, k), rel=1e-6) for g in optimizer.param_groups)


def test_schedule_rate_drives_the_update_and_survives_state_dict():
    # One weight, gradient 1, no momentum: each update is exactly rate(it) * lr_mult.
    spec = read_solver_spec('base_lr: 0.5 lr_policy: "step" gamma: 0.1 stepsize: 2')
    w = torch.nn.Parameter(torch.zeros(1))
    module = torch.nn.Module()
    module.w = w
    optimizer = CaffeOptimizerFactory(spec, module)([w])
    seen = []
    for _ in range(3):
        before = w.item()
        w.grad = torch.ones(1)
        optimizer.step()
        seen.append(before - w.item())
    np.testing.assert_allclose(seen, [0.5, 0.5, 0.05], rtol=1e-6)
    fresh = CaffeOptimizerFactory(spec, module)([w])
    fresh.load_state_dict(optimizer.state_dict())  # e.g. resumed between Spark stages
    assert fresh.param_groups[0]["caffe_iter"] == 3
    before = w.item()
    w.grad = torch.ones(1)
    fresh.step()
    assert before - w.item() == pytest.approx(0.05, rel=1e-6)


def test_clip_gradients_bounds_the_global_norm():
    spec = read_solver_spec('base_lr: 1 lr_policy: "fixed" clip_gradients: 1')
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    module = torch.nn.Module()
    module.a, module.b = a, b
    optimizer = CaffeOptimizerFactory(spec, module)([a, b])
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # norm 5 -> scaled to 1
    optimizer.step()
    torch.testing.assert_close(a.detach(), torch.tensor([-0.6, 0.0]))
    torch.testing.assert_close(b.detach(), torch.tensor([-0.8]))


def test_iter_size_becomes_a_larger_batch(lenet):
    spec = read_solver_spec('base_lr: 0.1 lr_policy: "fixed" iter_size: 3')
    assert effective_batch_size(lenet, spec, None) == 64 * 3
    assert effective_batch_size(lenet, spec, 10) == 30


def test_max_iter_sets_epochs(solver_spec):
    assert plan_epochs(solver_spec, batch_size=64, workers=2, rows=60000) == 22  # 10000*128/60000 = 21.3
    assert plan_epochs(solver_spec, batch_size=64, workers=2, rows=None) == 1


def test_short_single_process_run_lowers_the_loss(lenet, solver_spec):
    from sparkdp.comm import SingleProcessCollective
    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train.loop import FitSpec, fit_worker
    from sparkdp.train.optim import optimizer_factory

    # Two separable classes of 28x28 images: bright left half vs bright right half.
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (128,), generator=gen)
    x = torch.rand(128, 1, 28, 28, generator=gen) * 0.3
    x[y == 0, :, :, :14] += 0.6
    x[y == 1, :, :, 14:] += 0.6
    data = TensorData(x, y)
    spec = FitSpec(
        model=lenet,
        loss=lenet.caffe_loss(),
        optimizer=optimizer_factory(CaffeOptimizerFactory(solver_spec, lenet), lenet),
        strategy=resolve_strategy("allreduce"),
        train=data,
        eval=data,
        training=TrainingConfig(epochs=3, batch_size=16, memory_format="contiguous"),
    )
    out = fit_worker(spec, SingleProcessCollective())
    losses = [record["loss"] for record in out.history]
    assert losses[-1] < 0.5 * losses[0], losses
    assert out.history[-1]["test_accuracy"] > 0.9


def test_weights_round_trip_through_the_wrapper(lenet, lenet_path, tmp_path):
    path = save_weights(lenet, tmp_path / "lenet.caffemodel")
    fresh = CaffeClassifier(lenet_path, sample_shape=(1, 28, 28), raw_scale=255.0)
    summary = load_weights(fresh, path)
    assert summary.loaded == ("conv1", "conv2", "ip1", "ip2")
    x = torch.rand(3, 1, 28, 28)
    torch.testing.assert_close(fresh(x), lenet(x))
    plain = load_net(lenet_path, phase="TEST", input_shapes={"data": (3, 1, 28, 28)})
    assert load_weights(plain, path).loaded == ("conv1", "conv2", "ip1", "ip2")  # Caffe tooling's view


def test_nets_sparkdp_cannot_feed_are_refused_clearly():
    two_losses = TINY + ('layer { name: "loss2" type: "EuclideanLoss" bottom: "fc" bottom: "fc" top: "l2" }')
    with pytest.raises(ConfigError, match="exactly one loss layer.*'loss' \\(SoftmaxWithLoss\\), 'loss2'"):
        CaffeClassifier(two_losses, sample_shape=(5,))
    mirrored = TINY.replace("scale: 0.5", "scale: 0.5 mirror: true")
    with pytest.raises(ConfigError, match="mirror is not applied"):
        CaffeClassifier(mirrored, sample_shape=(5,))
    with pytest.raises(ConfigError, match="records in 'x'"):
        CaffeClassifier(TINY)  # a Data layer needs the row shape


def test_solver_net_path_falls_back_to_the_solver_directory(tmp_path):
    (tmp_path / "net.prototxt").write_text(TINY)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    spec = read_solver_spec(tmp_path / "solver.prototxt")
    assert solver_net_source(spec, tmp_path / "solver.prototxt") == tmp_path / "net.prototxt"
    missing = read_solver_spec('net: "examples/mnist/nope.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    with pytest.raises(ConfigError, match="--caffe-net"):
        solver_net_source(missing, tmp_path / "solver.prototxt")


def test_cli_job_builds_model_batch_epochs_and_initial_weights(lenet, lenet_path, tmp_path):
    from argparse import Namespace

    from sparkdp.cli.caffe_job import cli_job
    from sparkdp.config import JobConfig
    from sparkdp.data.tensors import TensorData

    weights = save_weights(lenet, tmp_path / "init.caffemodel")
    args = Namespace(
        caffe_net=str(lenet_path),
        caffe_solver=str(_example("lenet_solver.prototxt")),
        caffe_weights=str(weights),
        script=None,
        model=None,
        optimizer=None,
        lr=None,
        momentum=None,
        dataset="fashion-mnist",
        batch_size=None,
        epochs=2,
        workers=2,
        master=None,
        seed=5,
    )
    data = TensorData(torch.rand(10, 1, 28, 28), torch.randint(0, 10, (10,)))
    desc: dict = {}
    job = cli_job(args, JobConfig.of(workers=2, seed=5), data, desc)
    assert job.batch_size == 64 and job.epochs == 2 and job.model.raw_scale == 255.0
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(job.model(x), lenet(x))  # started from the given .caffemodel
    assert desc["caffe_weights"] == str(weights.resolve()) and desc["caffe_net"] == str(lenet_path.resolve())
    saved = job.save(tmp_path / "out")
    assert saved == tmp_path / "out" / "model.caffemodel" and load_weights(lenet, saved).loaded


@pytest.mark.spark
def test_fit_caffe_trains_on_spark(spark, lenet_path):
    from sparkdp.caffe.train import fit_caffe

    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (128,), generator=gen)
    x = torch.rand(128, 1, 28, 28, generator=gen) * 0.3
    x[y == 0, :, :, :14] += 0.6
    x[y == 1, :, :, 14:] += 0.6
    result = fit_caffe(
        lenet_path,
        _example("lenet_solver.prototxt"),
        (x, y),
        eval_data=(x, y),
        raw_scale=255.0,
        workers=2,
        epochs=2,
        batch_size=16,
        spark=spark,
        show_progress=False,
    )
    assert isinstance(result.model, CaffeClassifier) and result.epochs == 2
    assert result.history[-1]["test_accuracy"] > 0.9, result.history


def test_hdf5_data_net_trains_on_given_data_with_labels_shaped_as_caffe_does():
    """An HDF5Data layer states no shapes: the data's row shape gives `data`, labels are (N,)."""
    from tests.caffe.test_inspect_cli import HDF5_CLASSIFICATION

    model = CaffeClassifier(HDF5_CLASSIFICATION, sample_shape=(4,))
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 1, 0, 1, 0])
    assert model(x).shape == (6, 2)
    torch.testing.assert_close(model.caffe_loss()(model(x), y), F.cross_entropy(model(x), y))


def test_caffe_input_shape_flag_takes_named_shapes():
    from sparkdp.cli.main import build_parser

    args = build_parser().parse_args(
        ["train", "--caffe-input-shape", "label=10", "--caffe-input-shape", "aux=10,3"]
    )
    assert args.caffe_input_shape == {"label": (10,), "aux": (10, 3)}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--caffe-input-shape", "label=", "--caffe-input-shape", "x=1"])
