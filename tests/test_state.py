"""sparkdp.state: the one pickle-free format for nested state, checked on real optimizer state."""

import pytest
import torch
from safetensors.torch import save

from sparkdp import state
from tests.helpers.memory import run_capped


def test_an_adam_state_dict_round_trips_exactly():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    back = state.from_bytes(state.to_bytes(saved))
    assert back["param_groups"] == saved["param_groups"]  # tuples (betas), None, bools, int lists
    assert set(back["state"]) == {0, 1}  # int keys stay ints
    for idx, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(back["state"][idx][key], value), (idx, key)
    fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters())
    fresh.load_state_dict(back)  # what the DataFrame path does between epochs


def test_values_outside_the_format_are_named():
    with pytest.raises(TypeError, match=r"state value at state\.sched\.fn has type function"):
        state.to_bytes({"sched": {"fn": lambda: 0}})


def test_plain_safetensors_are_not_taken_for_state():
    with pytest.raises(ValueError, match="not sparkdp state"):
        state.from_bytes(save({"w": torch.zeros(2)}))


@pytest.mark.parametrize("cut", [4, 100, -5], ids=["header length", "header", "tensor data"])
def test_a_truncated_file_is_a_value_error_naming_it(tmp_path, cut):
    path = tmp_path / "state.safetensors"
    state.save({"w": torch.arange(50.0), "n": 3}, path)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=f"{path.name} is not a readable sparkdp state file"):
        state.load(path)


def test_a_missing_file_stays_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        state.load(tmp_path / "absent.safetensors")


GOOD = state.to_bytes({"w": torch.ones(3), "step": 4})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        GOOD[:7],  # shorter than the 8-byte header size
        GOOD[:-1],
        GOOD[: len(GOOD) // 2],  # truncated tensor data or header
        b"\xff" * 8 + GOOD[8:],  # a header size beyond the data
        GOOD[:8] + b"[" + GOOD[9:],  # a header that is not JSON
    ],
    ids=["empty", "7-bytes", "one-short", "half", "huge-header-size", "broken-header"],
)
def test_damaged_bytes_raise_value_error(data):
    """safetensors' own exception (and struct.error for short input) escaped from_bytes."""
    with pytest.raises(ValueError, match="not sparkdp state: they do not read as safetensors"):
        state.from_bytes(data)


@pytest.mark.parametrize(
    "skeleton",
    [
        '{"w": {"__tensor__": "t9"}}',  # a tensor that is not stored
        '{"w": {"__tensor__": []}}',
        '{"__items__": 1}',
        '{"__items__": [[1]]}',
        '{"__items__": [[[], 1]]}',
        '{"__tuple__": 5}',
        "[" * 100_000 + "]" * 100_000,  # deeper than Python's recursion limit
        "not json",
        '{"a": {"__tensor__": "t0"}, "b": [{"__tensor__": "t0"}]}',  # one tensor, two values
        "[" * 321 + "0" + "]" * 321,  # deeper than MAX_DEPTH
    ],
    ids=[
        "missing-tensor",
        "unhashable-name",
        "items-not-a-list",
        "item-not-a-pair",
        "unhashable-key",
        "tuple-not-a-list",
        "deep",
        "not-json",
        "tensor-named-twice",
        "deeper-than-max-depth",
    ],
)
def test_a_damaged_skeleton_raises_value_error(skeleton):
    """The skeleton is read by json and unflatten: KeyError, TypeError and RecursionError escaped."""
    data = save({"t0": torch.ones(3)}, metadata={state.META_KEY: skeleton})
    with pytest.raises(ValueError, match="damaged sparkdp state"):
        state.from_bytes(data)


def test_each_stored_tensor_is_one_value_and_nesting_is_bounded():
    """A skeleton naming one tensor many times would make every copy of the values a copy of the
    tensor: a small file, a large allocation. Refused by name, as is nesting past MAX_DEPTH."""
    stored = {"t0": torch.ones(3), "t1": torch.zeros(2)}
    twice = save(stored, metadata={state.META_KEY: '[{"__tensor__": "t0"}, {"__tensor__": "t0"}]'})
    with pytest.raises(ValueError, match="names tensor 't0' twice; sparkdp state stores each tensor once"):
        state.from_bytes(twice)
    once = state.from_bytes(
        save(stored, metadata={state.META_KEY: '[{"__tensor__": "t1"}, {"__tensor__": "t0"}]'})
    )
    assert torch.equal(once[0], stored["t1"]) and torch.equal(once[1], stored["t0"])
    deepest = state.from_bytes(save(stored, metadata={state.META_KEY: "[" * 320 + "7" + "]" * 320}))
    for _ in range(320):
        (deepest,) = deepest
    assert deepest == 7
    deeper = save(stored, metadata={state.META_KEY: "[" * 321 + "7" + "]" * 321})
    with pytest.raises(ValueError, match=f"nested more than {state.MAX_DEPTH} levels deep"):
        state.from_bytes(deeper)


def test_a_models_parts_join_into_the_whole_state_in_the_parts_order():
    """Dim-0 slices of a weight (one of them empty) and whole entries: the join is the tensors
    torch.cat makes of the slices by index, whatever order the parts arrive in."""
    w, b = torch.arange(12.0).reshape(3, 4), torch.tensor([5.0, 6.0, 7.0])
    steps = torch.tensor(9)
    first = state.part_to_bytes({"w": w[:2], "b": b[:2], "steps": steps}, {"w": (0, 3, 3), "b": (0, 2, 3)})
    second = state.part_to_bytes({"w": w[2:], "b": b[2:]}, {"w": (1, 3, 3), "b": (1, 2, 3)})
    third = state.part_to_bytes({"w": w[3:]}, {"w": (2, 3, 3)})  # the rank holding no row of w
    joined = state.join_parts([third, first, second])
    assert list(joined) == ["w", "b", "steps"]
    assert torch.equal(joined["w"], w) and torch.equal(joined["b"], b) and torch.equal(joined["steps"], steps)
    plain = state.join_parts([state.state_to_bytes({"w": w})])  # a strategy's whole state is one part
    assert torch.equal(plain["w"], w)


def test_parts_that_do_not_make_a_whole_are_refused_naming_the_entry():
    w = torch.arange(6.0).reshape(3, 2)
    head = state.part_to_bytes({"w": w[:2]}, {"w": (0, 2, 3)})
    other = state.state_to_bytes({"b": torch.ones(1)})  # a part holding no slice of w
    with pytest.raises(ValueError, match=r"slices \[1\] of 2 of 'w' are missing"):
        state.join_parts([head, other])
    with pytest.raises(ValueError, match=r"slice 0 of 2 of 'w' is given twice"):
        state.join_parts([head, head])
    with pytest.raises(ValueError, match="cut into 2 and 3 slices of a tensor of 3 and 3 rows"):
        state.join_parts([head, state.part_to_bytes({"w": w[2:]}, {"w": (1, 3, 3)}), other])
    with pytest.raises(ValueError, match=r"\['w'\] are both whole and sliced"):
        state.join_parts(
            [head, state.part_to_bytes({"w": w[2:]}, {"w": (1, 2, 3)}), state.state_to_bytes({"w": w})]
        )
    for layout in ('{"w": 3}', '{"w": [0, 1]}', '{"w": [0, true, 3]}', '{"w": [0, 1, 3.0]}', "[]"):
        damaged = save({"w": w}, metadata={state.PART_KEY: layout})
        with pytest.raises(ValueError, match="metadata is damaged"):
            state.join_parts([damaged])
    with pytest.raises(ValueError, match="a part of the model's state is not safetensors"):
        state.join_parts([head, head[:-3]])


def _shards(whole: torch.Tensor, count: int) -> list[torch.Tensor]:
    """FSDP2's dim-0 shards of ``whole``: torch.chunk's pieces, then empty ones up to ``count``."""
    pieces = list(torch.chunk(whole, count))
    return pieces + [whole[:0]] * (count - len(pieces))


def _parts(shards: list[torch.Tensor], rows: int) -> list[bytes]:
    count = len(shards)
    return [state.part_to_bytes({"w": shard}, {"w": (i, count, rows)}) for i, shard in enumerate(shards)]


@pytest.mark.parametrize(("rows", "count"), [(5, 2), (4, 3), (1, 4), (0, 2), (7, 7)])
def test_fsdp_shards_join_into_what_torch_cat_makes_of_them(rows, count):
    whole = torch.randn(rows, 3, generator=torch.Generator().manual_seed(rows))
    shards = _shards(whole, count)
    joined = state.join_parts(_parts(shards, rows)[::-1])["w"]
    assert (
        joined.dtype == whole.dtype and torch.equal(joined, torch.cat(shards)) and torch.equal(joined, whole)
    )


@pytest.mark.timeout(60)
def test_a_slice_count_beyond_the_parts_is_refused_before_anything_is_counted():
    """A part claiming its entry is cut into 10**12 slices once made the join build a set of
    10**12 numbers; the count is bounded by the parts given. Run capped (RLIMIT_AS), so that a
    join that counts to the claim fails with MemoryError there instead of taking this machine."""
    result = run_capped(
        """
        import torch
        from sparkdp import state
        share = state.part_to_bytes({"w": torch.ones(2, 3)}, {"w": (0, 10**12, 2)})
        cap(256 << 20)
        try:
            state.join_parts([share])
        except ValueError as err:
            print("refused:", err)
        """
    )
    assert "refused: 'w' is cut into 1000000000000 slices, but 1 part(s) were given" in result.stdout, (
        result.stdout + result.stderr
    )
    with pytest.raises(ValueError, match=r"cut into 0 slices, but 1 part\(s\)"):
        state.join_parts([state.part_to_bytes({"w": torch.ones(2)}, {"w": (0, 0, 2)})])


def test_slices_of_another_width_dtype_or_length_are_refused_naming_them():
    """The join of what the ranks sent is torch.cat of the true shards, or a ValueError: never a
    RuntimeError from torch.cat, a promoted dtype, or a tensor of another shape than declared."""
    whole = torch.arange(12.0).reshape(4, 3)
    shards = _shards(whole, 2)
    assert torch.equal(state.join_parts(_parts(shards, 4))["w"], torch.cat(shards))
    wider = _parts([shards[0], torch.zeros(2, 4)], 4)
    with pytest.raises(
        ValueError, match=r"slice 1 of 'w' is torch.float32 \(2, 4\), another is torch.float32 \(2, 3\)"
    ):
        state.join_parts(wider)
    double = _parts([shards[0], shards[1].double()], 4)
    with pytest.raises(
        ValueError, match=r"slice 1 of 'w' is torch.float64 \(2, 3\), another is torch.float32"
    ):
        state.join_parts(double)
    longer = _parts([shards[0], torch.zeros(3, 3)], 4)
    with pytest.raises(ValueError, match="the slices of 'w' hold 5 rows, not the 4 its parts declare"):
        state.join_parts(longer)
    shorter = _parts([shards[0], shards[1][:1]], 4)
    with pytest.raises(ValueError, match="hold 3 rows, not the 4"):
        state.join_parts(shorter)
    with pytest.raises(
        ValueError, match="the parts disagree on 'w': it is cut into 2 and 2 slices of a tensor of 4 and 5"
    ):
        state.join_parts([_parts(shards, 4)[0], _parts(shards, 5)[1]])
    scalar = [state.part_to_bytes({"w": torch.tensor(1.0)}, {"w": (0, 1, 1)})]
    with pytest.raises(ValueError, match=r"slice 0 of 'w' is torch.float32 \(\): the slices of an entry"):
        state.join_parts(scalar)


def test_tensors_sharing_storage_are_written_each_as_itself():
    """Tied weights and views of one buffer (which safetensors refuses to save as they are) come
    back as equal, separate tensors, in a state dict, nested state and a part alike."""
    buffer = torch.arange(12.0)
    weight = buffer.view(3, 4)
    tied = {"emb": weight, "head": weight, "row": buffer[4:8], "col": weight[:, 1]}
    want = {k: v.clone() for k, v in tied.items()}
    for back in (
        state.state_from_bytes(state.state_to_bytes(tied)),
        state.from_bytes(state.to_bytes({"model": tied}))["model"],
        state.join_parts([state.part_to_bytes(tied, {})]),
    ):
        assert back.keys() == want.keys()
        assert all(torch.equal(back[k], want[k]) for k in want)
        back["emb"].zero_()
        assert torch.equal(back["head"], want["head"])  # separate tensors, not views of one another
    assert torch.equal(weight, want["emb"])  # and encoding left the originals as they were
