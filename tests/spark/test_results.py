"""A task's result on its way to the driver: data in, the same data out, and nothing else."""

import json
import pickle
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_save

from sparkdp.errors import ConfigError
from sparkdp.spark.results import decode, encode
from sparkdp.state import state_from_bytes, state_to_bytes
from sparkdp.train.report import WorkerReport
from tests.helpers.memory import run_capped

pytestmark = pytest.mark.timeout(60)


def _round_trip(value, stage="stage-a", index=3):
    return decode(encode(stage, index, value), stage, index)


def _same(a, b):
    """``a`` the value ``b`` was sent as: equal values of equal types (a dict of any class comes back
    a dict), tensors and arrays compared by dtype, shape and contents."""
    assert type(a) is (dict if isinstance(b, dict) else type(b)), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**80,
        2.5,
        float("inf"),
        float("nan"),
        "",
        "résumé",
        b"",
        b"\x00\xffbytes",
        [1, "a", None],
        (1, (2.0, "b")),
        [],
        (),
        {},
        {"loss": 0.25, "epochs": 3},
        {1: "int key", (2, "x"): "tuple key", None: 0.5},
        torch.arange(6, dtype=torch.float32).reshape(2, 3),
        torch.tensor([True, False]),
        torch.zeros(0, 4),
        torch.ones(3, dtype=torch.bfloat16),
        torch.arange(4, dtype=torch.int64),
        OrderedDict(weight=torch.ones(2, 3), bias=torch.zeros(2)),  # what state_dict() returns
        np.arange(6, dtype=np.float64).reshape(3, 2),
        np.array([1, 2], dtype=np.uint8),
        np.array([True]),
        np.zeros((0,), dtype=np.int32),
        {"model": {"w": torch.ones(2, 2)}, "curve": [0.9, 0.5], "ids": np.arange(3), "raw": b"abc"},
    ],
    ids=repr,
)
def test_every_kind_a_run_may_return_comes_back_as_it_was(value):
    _same(_round_trip(value), value)


def test_views_non_contiguous_and_gpu_like_inputs_come_back_as_plain_cpu_values():
    base = torch.arange(12.0).reshape(3, 4)
    _same(
        _round_trip({"t": base.t(), "p": torch.nn.Parameter(torch.ones(2))}),
        {"t": base.t().contiguous(), "p": torch.ones(2)},
    )
    array = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::-2]  # big-endian, negative strides
    back = _round_trip(array)
    assert back.dtype == np.int32 and np.array_equal(back, array)
    assert _round_trip([np.float32(1.5), np.int64(7), np.bool_(True)]) == [1.5, 7, True]


def test_dict_keys_that_look_like_the_codecs_own_tags_stay_user_keys():
    value = {
        "__bytes__": 1,
        "__ndarray__": [2],
        "__record__": "x",
        "__result_items__": None,
        "__tensor__": "state's own tag",
        "__tuple__": (),
        "__items__": {},
    }
    _same(_round_trip(value), value)
    _same(_round_trip({"__bytes__": b"real bytes"}), {"__bytes__": b"real bytes"})


def test_a_worker_report_comes_back_field_for_field():
    model = torch.nn.Linear(4, 2)
    report = WorkerReport(
        state=state_to_bytes(model.state_dict()),
        history=[{"epoch": 0, "loss": 0.75, "samples": 64, "epoch_time_s": 0.5, "test_accuracy": 0.5}],
        train_time_s=1.25,
        samples=64,
        strategy_options={"k": 4, "compression": None},
        strategy_state={"step": 12},
        data_counters={"dropped_null_rows": 2},
        optimizer_state=b"\x01\x02",
        worker=1,
        strategy_metrics={"pushes": 9, "staleness": {0: 5, 2: 4}},
        wall_start=10.0,
        wall_end=11.5,
    )
    back = _round_trip([report, None])
    assert isinstance(back[0], WorkerReport) and back == [report, None]
    weights = state_from_bytes(back[0].state)
    assert torch.equal(weights["weight"], model.weight.detach()) and torch.equal(
        weights["bias"], model.bias.detach()
    )


_Point = namedtuple("_Point", "x y")


def test_a_reports_settings_that_are_not_data_travel_as_their_text():
    """Strategy options are shown, not used, on the driver: a server optimizer given as a factory
    must not fail the job at its end."""

    def factory(params):
        return torch.optim.SGD(params, lr=0.1)

    report = WorkerReport(
        state=b"",
        history=[],
        train_time_s=0.0,
        samples=0,
        strategy_options={
            "rule": "asgd",
            "rule_options": {"server_optimizer": factory, "lr": 0.1},
            "betas": (0.9, torch.float32),
            "at": _Point(1, print),
        },
    )
    back = _round_trip(report)
    assert back.strategy_options == {
        "rule": "asgd",
        "rule_options": {"server_optimizer": repr(factory), "lr": 0.1},
        "betas": (0.9, "torch.float32"),
        "at": (1, repr(print)),
    }
    with pytest.raises(ConfigError, match=r"the result\.strategy_state\['f'\] has type function"):
        encode(
            "s",
            0,
            WorkerReport(state=b"", history=[], train_time_s=0.0, samples=0, strategy_state={"f": factory}),
        )


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({1, 2}, r"the result has type set"),
        ([torch.nn.Linear(1, 1)], r"the result\[0\] has type torch\.nn\.modules\.linear\.Linear"),
        ({"f": lambda: 1}, r"the result\['f'\] has type function"),
        (np.array(["a", "b"]), r"has type numpy\.ndarray of dtype <U1"),
        (np.array([1, None], dtype=object), r"has type numpy\.ndarray of dtype object"),
        (np.array([1j]), r"of dtype complex128"),
        ({object(): 1}, r"a key of the result has type object \(a dict key must be"),
        (torch.eye(2).to_sparse(), r"with layout torch.sparse_coo"),
    ],
)
def test_what_is_not_data_is_refused_on_the_worker_saying_what_to_do(value, named):
    with pytest.raises(ConfigError, match=named) as caught:
        encode("s", 0, value)
    message = str(caught.value)
    assert "never as a pickle" in message and "torch tensors, numpy arrays" in message
    assert "model.state_dict()" in message and "save anything else to a file" in message


def test_a_structure_that_contains_itself_is_refused():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        encode("s", 0, loop)


def test_only_this_stages_result_for_this_task_is_read():
    cell = encode("stage-a", 2, {"x": 1})
    with pytest.raises(ValueError, match=r"result of task 2 of stage 'stage-a', not of task 2 of this stage"):
        decode(cell, "stage-b", 2)
    with pytest.raises(ValueError, match=r"result of task 2 of stage 'stage-a', not of task 1"):
        decode(cell, "stage-a", 1)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize(
    "make",
    [
        lambda marker: pickle.dumps(_Exploit(marker)),
        lambda marker: pickle.dumps({"format": "sparkdp-result/1", "value": _Exploit(marker)}),
        lambda marker: b"\x00" * 64,
        lambda marker: safetensors_save({"t": torch.ones(1)}),  # safetensors, but not sparkdp state
        lambda marker: safetensors_save(
            {"t": torch.ones(1)}, metadata={"sparkdp": '{"format": "x", "value": 1}'}
        ),
        lambda marker: safetensors_save(
            {},
            metadata={
                "sparkdp": '{"format": "sparkdp-result/1", "stage": "s", '
                '"index": 0, "value": {"__record__": ["os.system", '
                '{"command": "x"}]}}'
            },
        ),
        lambda marker: safetensors_save(
            {},
            metadata={
                "sparkdp": '{"format": "sparkdp-result/1", "stage": "s", '
                '"index": 0, "value": {"__bytes__": "not a tensor"}}'
            },
        ),
        lambda marker: safetensors_save(
            {},
            metadata={
                "sparkdp": '{"format": "sparkdp-result/1", "stage": "s", '
                '"index": 0, "value": {"__record__": ["WorkerReport", '
                '{"state": 1}]}}'
            },
        ),
    ],
    ids=[
        "pickle",
        "pickle in the result's shape",
        "zeros",
        "plain safetensors",
        "other document",
        "unknown record",
        "bytes tag on a string",
        "record with missing fields",
    ],
)
def test_anything_else_is_refused_and_nothing_in_it_runs(make, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match=r"not a sparkdp task result|not a task result|document is damaged"):
        decode(make(str(marker)), "s", 0)
    assert not marker.exists()


def _forged(value_json: str, tensors: dict | None = None) -> bytes:
    """A result cell whose document is ``value_json`` around ``tensors``: what whoever can write
    the result column can send."""
    document = f'{{"format": "sparkdp-result/1", "stage": "s", "index": 0, "value": {value_json}}}'
    return safetensors_save(tensors or {}, metadata={"sparkdp": document})


def test_a_tensor_named_twice_is_refused_so_a_small_result_cannot_expand():
    """One stored tensor named by many references once came back as a copy per reference (a
    1 MiB tensor named 4,000 times in a 1.16 MiB cell: 4 GiB). sparkdp names each tensor once."""
    cell = _forged(
        json.dumps([{"__bytes__": {"__tensor__": "t0"}}] * 2), {"t0": torch.zeros(4, dtype=torch.uint8)}
    )
    with pytest.raises(ValueError, match="not a sparkdp task result.*names tensor 't0' twice"):
        decode(cell, "s", 0)
    shared = torch.arange(4.0)
    back = _round_trip(
        {"a": shared, "b": shared, "raw": [b"xy", b"xy"]}
    )  # one tensor given twice is sent twice
    _same(back, {"a": shared, "b": shared, "raw": [b"xy", b"xy"]})
    back["a"].zero_()
    assert torch.equal(back["b"], shared)


def test_a_result_nested_deeper_than_a_worker_may_send_is_refused():
    deepest = 1
    for _ in range(64):  # the deepest value encode takes
        deepest = [deepest]
    assert _round_trip(deepest) == deepest
    assert decode(_forged("[" * 64 + "1" + "]" * 64), "s", 0) == deepest
    with pytest.raises(ValueError, match="document is damaged.*nested more than 64 levels deep"):
        decode(_forged("[" * 65 + "1" + "]" * 65), "s", 0)


@pytest.mark.timeout(120)
def test_decoding_a_result_stays_within_its_size_under_an_address_space_limit():
    """Decoding a result of N bytes holds about 2 N (its tensors, then its bytes and arrays) plus
    its JSON's Python objects. Under a limit of 256 MiB above what the interpreter maps: the
    4,000-reference cell (4 GiB once) is refused; a 72 MiB result of bytes, a tensor and an array
    decodes; a 160 MiB one that cannot fit is a WorkerFailed saying so, never a MemoryError."""
    result = run_capped(
        """
        import json, numpy as np
        from safetensors.torch import save
        from sparkdp.errors import WorkerFailed
        from sparkdp.spark.launcher import _decoded
        from sparkdp.spark.results import decode, encode

        document = {"format": "sparkdp-result/1", "stage": "s", "index": 0,
                    "value": [{"__bytes__": {"__tensor__": "t0"}}] * 4000}
        amplified = save({"t0": torch.zeros(1 << 20, dtype=torch.uint8)}, metadata={"sparkdp": json.dumps(document)})
        mib = 1 << 20
        fits = encode("s", 0, {"raw": bytes(24 * mib), "t": torch.ones(6 * mib), "a": np.ones(3 * mib)})
        too_big = encode("s", 1, bytes(160 * mib))
        decode(encode("s", 0, {"raw": b"x", "t": torch.ones(2), "a": np.ones(2)}), "s", 0)  # warm
        cap(256 * mib)
        print("amplified:", len(amplified))
        try:
            decode(amplified, "s", 0)
        except ValueError as err:
            print("refused:", err)
        back = decode(fits, "s", 0)
        print("decoded:", len(back["raw"]), float(back["t"].sum()), float(back["a"].sum()))
        del back
        try:
            _decoded({0: too_big}, "s", 1)
        except WorkerFailed as err:
            print("failed:", err)
        """
    )
    out = result.stdout + result.stderr
    assert "amplified: 1220760" in out and "refused: it is not a sparkdp task result" in out, out
    assert "names tensor 't0' twice" in out, out
    assert f"decoded: {24 << 20} {float(6 << 20)} {float(3 << 20)}" in out, out
    assert "failed: the result of task 1 (167,772," in out and "did not fit in the driver's memory" in out, (
        out
    )
    assert result.returncode == 0, out
