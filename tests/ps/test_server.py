import math
import threading

import pytest
import torch

from sparkdp.errors import AuthenticationError, ConfigError
from sparkdp.ps import ParameterServer, PushRejected
from sparkdp.ps.transport import ConnectFailed, InProcTransport
from sparkdp.rules.base import Locking
from tests.ps.conftest import Recorder, Sub, make_ps

N_THREADS, N_PUSHES = 8, 200


def _hammer(client_for, shapes, n_threads=N_THREADS, n_pushes=N_PUSHES):
    errors = []
    start = threading.Barrier(n_threads)

    def worker(w):
        try:
            client = client_for(w)
            ones = [torch.ones(s) for s in shapes]
            start.wait(timeout=10)
            for seq in range(n_pushes):
                versions, _ = client.pull()
                assert client.push(seq, versions, ones).applied
            client.close()
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,), name=f"test-worker-{w}") for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "worker threads hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("use_codec", [False, True])
def test_global_lock_loses_no_update_inproc(use_codec):
    shapes = [(64, 64), (5,)]
    ps = make_ps(shapes, num_shards=2)
    transport = InProcTransport(use_codec=use_codec)
    ep = transport.serve(ps)
    _hammer(lambda w: transport.connect(ep.address, ep.info.secret, w), shapes)
    expected = -float(N_THREADS * N_PUSHES)
    for t in ps.pull(0).tensors:
        assert torch.all(t == expected), (t.flatten()[:5], expected)
    assert ps.versions() == [N_THREADS * N_PUSHES] * ps.num_shards
    assert ps.metrics()["pushes_applied"] == N_THREADS * N_PUSHES


def test_hogwild_is_finite_and_raises_nothing():
    shapes = [(256,)]
    ps = ParameterServer(lambda s: Sub(locking=Locking.NONE), [torch.zeros(s) for s in shapes])
    assert ps.locking == [Locking.NONE]
    transport = InProcTransport()
    ep = transport.serve(ps)
    _hammer(lambda w: transport.connect(ep.address, ep.info.secret, w), shapes)
    (center,) = ps.pull(0).tensors
    assert torch.isfinite(center).all() and (center <= 0).all()
    # versions are atomic even without the apply lock: one ticket per push
    assert ps.versions() == [N_THREADS * N_PUSHES]


def test_locking_override():
    ps = ParameterServer(lambda s: Sub(locking=Locking.NONE), [torch.zeros(3)], locking="global")
    assert ps.locking == [Locking.GLOBAL]
    with pytest.raises(ValueError):
        ParameterServer(lambda s: Sub(), [torch.zeros(3)], locking="sometimes")


def test_staleness_scripted_interleaving():
    ps = make_ps(rule=Recorder)
    rule = ps._rules[0]
    g = [torch.ones(3)]
    v0, _ = ps.pull(0)  # w0 pulls v0
    v1, _ = ps.pull(1)  # w1 pulls v0
    ps.push(0, 0, v0, g)  # applied at version 0: tau = 0
    ps.push(1, 0, v1, g)  # one update since w1 pulled: tau = 1
    v0, _ = ps.pull(0)  # w0 pulls v2
    v2, _ = ps.pull(2)  # w2 pulls v2
    ps.push(1, 1, v1, g)  # w1 pushes again from its old v0: tau = 2
    ps.push(2, 0, v2, g)  # tau = 3 - 2 = 1
    ps.push(0, 1, v0, g)  # tau = 4 - 2 = 2
    ps.push(0, 2, None, g)  # None: server's record of w0's last pull (v2): tau = 5 - 2 = 3
    assert rule.taus == [(0, 0), (1, 1), (1, 2), (2, 1), (0, 2), (0, 3)]
    assert ps.metrics()["staleness"] == {0: 1, 1: 2, 2: 2, 3: 1}


def test_staleness_is_per_shard():
    ps = make_ps([(100_000,), (100_000,)], num_shards=2, rule=Recorder)
    g = [torch.ones(100_000), torch.ones(100_000)]
    versions, _ = ps.pull(0)
    ps.pull(0, shards=[1])  # only shard 1's pulled version is refreshed ...
    ps.push(1, 0, versions, g)
    fresh, _ = ps.pull(0, shards=[1])
    ps.push(0, 0, [versions[0], fresh[0]], g)  # ... so shard 0 is 1 behind, shard 1 is current
    assert [r.taus[-1] for r in ps._rules] == [(0, 1), (0, 0)]


def test_idempotent_pushes_and_a_continuing_task():
    ps = make_ps()
    v, _ = ps.pull(7)
    assert ps.push(7, 0, v, [torch.ones(3)]).applied
    before = ps.pull(7).tensors[0].clone()
    ack = ps.push(7, 0, v, [torch.ones(3)])  # the retried / speculative twin
    assert not ack.applied and ack.versions == [1]
    assert torch.equal(ps.pull(7).tensors[0], before)
    assert ps.metrics()["duplicates_dropped"] == 1
    # a replacement task with the same worker id resumes after last_seq
    assert ps.last_seq(7) == 0
    assert ps.push(7, ps.last_seq(7) + 1, None, [torch.ones(3)]).applied
    assert torch.equal(ps.pull(7).tensors[0], torch.full((3,), -2.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_push_rejected_naming_the_worker(bad):
    ps = make_ps([(3,), (2,)])
    v, _ = ps.pull(5)
    ps.push(5, 0, v, [torch.ones(3), torch.ones(2)])
    good = [t.clone() for t in ps.pull(5).tensors]
    with pytest.raises(PushRejected, match="worker 5.*tensor 1 contains NaN or Inf"):
        ps.push(5, 1, v, [torch.ones(3), torch.tensor([1.0, bad])])
    assert all(torch.equal(a, b) for a, b in zip(ps.pull(5).tensors, good, strict=True))
    assert ps.metrics()["rejected"] == 1 and ps.last_seq(5) == 0  # the seq was not consumed
    assert ps.push(6, 0, v, [torch.ones(3), torch.ones(2)]).applied  # others are still served


def test_large_finite_values_are_not_mistaken_for_overflow():
    ps = make_ps([(4,)])
    big = torch.full((4,), 3e38)  # the sum overflows, the values are finite
    assert ps.push(0, 0, [0], [big]).applied


@pytest.mark.parametrize(
    ("tensors", "versions", "match"),
    [
        ([torch.ones(4)], [0], r"shape=\(4,\), expected dtype=torch.float32 shape=\(3,\)"),
        ([torch.ones(3, dtype=torch.float64)], [0], "dtype=torch.float64"),
        ([torch.ones(3), torch.ones(3)], [0], "got 2 tensors"),
        ([torch.ones(3)], [1], "pulled_versions"),
        ([torch.ones(3)], [0, 0], "pulled_versions"),
        ([torch.ones(3)], None, "never pulled"),
        ([torch.ones(3)], 0, "pulled_versions=0 must be 1 ints"),  # e.g. a number off the wire
        ([torch.ones(3)], 0.5, "pulled_versions=0.5 must be 1 ints"),
    ],
)
def test_bad_pushes_are_rejected_clearly(tensors, versions, match):
    ps = make_ps()
    with pytest.raises(PushRejected, match=match):
        ps.push(3, 0, versions, tensors)
    assert torch.equal(ps.pull(3).tensors[0], torch.zeros(3))


def test_bad_arguments():
    ps = make_ps()
    with pytest.raises(PushRejected, match="seq must be"):
        ps.push(0, "1", [0], [torch.ones(3)])
    with pytest.raises(PushRejected, match="local_steps"):
        ps.push(0, 0, [0], [torch.ones(3)], num_samples=1, local_steps=0)
    with pytest.raises(ValueError, match="worker id"):
        ps.pull(-1)
    with pytest.raises(ValueError, match="shards"):
        ps.pull(0, shards=[3])
    with pytest.raises(ConfigError, match="UpdateRule"):
        ParameterServer(lambda s: object(), [torch.zeros(1)])


def test_params_are_copied_and_out_is_filled():
    p = torch.zeros(2, 3)
    ps = ParameterServer(lambda s: Sub(), [p])
    ps.push(0, 0, [0], [torch.ones(2, 3)])
    assert torch.equal(p, torch.zeros(2, 3))
    out = [torch.empty(2, 3)]
    pulled = ps.pull(0, out=out)
    assert pulled.tensors[0] is out[0] and torch.equal(out[0], -torch.ones(2, 3))


def _trained_ps():
    ps = make_ps([(300, 300), (7,)], num_shards=3)
    for w in range(3):
        v, _ = ps.pull(w)
        ps.push(w, 0, v, [torch.randn(300, 300), torch.randn(7)])
    ps.pull(1)
    return ps


def _round_trip(ps, tmp_path, fresh):
    """``ps``'s state through a checkpoint file into ``fresh``."""
    from sparkdp.train.checkpoint_store import CheckpointStore

    store = CheckpointStore(str(tmp_path), "job")
    fresh.load_state_dict(store.load(store.save("ps", "000000", ps.state_dict())))


def test_save_load_round_trip(tmp_path):
    ps = _trained_ps()
    fresh = make_ps([(300, 300), (7,)], num_shards=3)
    _round_trip(ps, tmp_path, fresh)
    a, b = ps.state_dict(), fresh.state_dict()
    assert all(torch.equal(x, y) for x, y in zip(a["center"], b["center"], strict=True))
    assert a["versions"] == b["versions"] == [3, 3, 3]
    assert a["last_seq"] == b["last_seq"] and a["last_pulled"] == b["last_pulled"]
    assert fresh._rules[0].applied == 3
    assert list(fresh._rules[0].per_worker) == [3]  # int keys survive (not turned into "3")
    assert torch.equal(fresh._rules[0].per_worker[3], torch.arange(4.0))
    assert not fresh.push(2, 0, None, [torch.ones(300, 300), torch.ones(7)]).applied  # books restored
    assert [p.name for p in tmp_path.iterdir()] == ["ps-000000-job.safetensors"]


def test_load_refuses_another_layout_and_other_state(tmp_path):
    with pytest.raises(ConfigError, match="different model or shard layout"):
        _round_trip(_trained_ps(), tmp_path, make_ps([(300, 300), (7,)], num_shards=2))
    with pytest.raises(ValueError, match="not a parameter server's state"):
        make_ps([(10,)]).load_state_dict({"center": [torch.ones(10)]})


def test_metrics_count_bytes():
    ps = make_ps([(10,)])
    v, _ = ps.pull(0)
    ps.push(0, 0, v, [torch.ones(10)])
    m = ps.metrics()
    assert (m["pulls"], m["bytes_out"], m["bytes_in"]) == (1, 40, 40)
    assert math.isclose(sum(m["staleness"].values()), 1)


def test_inproc_checks_the_secret_and_the_address():
    transport = InProcTransport()
    ep = transport.serve(make_ps())
    with pytest.raises(AuthenticationError, match="worker 2"):
        transport.connect(ep.address, b"x" * 32, 2)
    with pytest.raises(ConnectFailed, match="inproc://99"):
        transport.connect("inproc://99", ep.info.secret, 2)
    client = transport.connect(ep.address, ep.info.secret, 2)
    ep.close()
    with pytest.raises(ConnectFailed, match="closed"):
        client.pull()
