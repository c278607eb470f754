"""Hugging Face ``Trainer`` and ``accelerate`` scripts run unmodified under ``sparkdp launch``
(local[2]): each rank sees torchrun's environment (two ranks on one host: LOCAL_RANK 0 and 1,
LOCAL_WORLD_SIZE 2), the workers train as one job (no warning that they trained alone), and the
monitor's per-worker table counts their steps and bytes. Nothing is downloaded: the tokenizer is
trained here on a file of Python's standard library."""

from __future__ import annotations

import heapq
import json
import textwrap
from pathlib import Path

import pytest

from .conftest import Cli
from .test_cli import _explain

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(300)]
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
tokenizers = pytest.importorskip("tokenizers")
try:  # Trainer (at import) and accelerate (preparing a distributed DataLoader) import `datasets`,
    # which must match the installed pyarrow; transformers.trainer imports it when installed
    import transformers.trainer  # noqa: F401
except Exception as exc:  # an installation problem (e.g. datasets < 2.20 with pyarrow >= 21), not sparkdp's
    pytest.skip(
        f"transformers/accelerate cannot be imported here ({type(exc).__name__}: {exc}); "
        "pip install 'sparkdp[hf]'",
        allow_module_level=True,
    )

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "hf"
STEPS = 3
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def _tokenizer(out: Path) -> Path:
    """A byte-level BPE tokenizer trained on textwrap.py, saved as transformers saves one in ``out``."""
    from transformers import PreTrainedTokenizerFast

    out.mkdir()
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train([textwrap.__file__], vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    ).save_pretrained(out)
    return out


def _per_worker(output: str) -> dict[str, tuple[int, int, float]]:
    """The monitor's per-worker summary: worker -> (steps, samples, MB sent)."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if (
            len(cells) == 9
            and cells[0] in ("0", "1")
            and cells[2].isdigit()
            and cells[-1].replace(".", "").isdigit()
        ):
            rows[cells[0]] = (
                int(cells[2].replace(",", "")),
                int(cells[3].replace(",", "")),
                float(cells[-1]),
            )
    return rows


def _launch(script: str, tmp: Path) -> Cli:
    """The script on 2 workers of local[2], writing each rank's view into ``tmp/out``."""
    (tmp / "out").mkdir()
    return Cli(
        [
            "launch",
            "--workers",
            "2",
            "--master",
            "local[2]",
            str(SCRIPTS / script),
            "--",
            str(_tokenizer(tmp / "tokenizer")),
            heapq.__file__,
            str(tmp / "out"),
            str(STEPS),
        ],
        master="local[2]",
        timeout=280,
        # the scripts run on the executors: one Hugging Face home, in the session's base temporary
        # directory, for all of them
        spark_env={**OFFLINE, "HF_HOME": str(tmp.parent / "hf-home")},
    )


def _views(cli) -> list[dict]:
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    output = proc.stdout + proc.stderr
    assert "trained its own independent copy" not in output, _explain(proc)
    table = _per_worker(output)
    assert set(table) == {"0", "1"}, _explain(proc)
    for steps, samples, mb_sent in table.values():
        # every step trains 2 rows, and its gradients (about 45 000 float32 values) are all-reduced
        assert steps == STEPS and samples == 2 * STEPS and mb_sent > 0, table
    return [json.loads((cli.tmp / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]


def _check_places(views: list[dict]) -> None:
    for rank, view in enumerate(views):
        assert {
            k: view[k]
            for k in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "GROUP_RANK",
                "GROUP_WORLD_SIZE",
                "ROLE_NAME",
                "TORCHELASTIC_RESTART_COUNT",
            )
        } == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default",
            "TORCHELASTIC_RESTART_COUNT": "0",
        }
        # what the library made of it: one local main process, rank 0
        assert (view["hf_local_rank"], view["hf_world_size"]) == (rank, 2)
        assert view["local_zero"] is view["world_zero"] is (rank == 0)
        assert view["steps"] == STEPS
    # the loss each script reports is the mean over both ranks (gathered): one job, not two
    assert views[0]["loss"] == pytest.approx(views[1]["loss"], rel=1e-6)


@pytest.mark.cli(build=lambda tmp: _launch("trainer.py", tmp))
def test_a_trainer_script_runs_unmodified(cli):
    views = _views(cli)
    _check_places(views)
    assert all(v["distributed"] == "ParallelMode.DISTRIBUTED" for v in views)


@pytest.mark.cli(build=lambda tmp: _launch("accelerate_loop.py", tmp))
def test_an_accelerate_script_runs_unmodified(cli):
    views = _views(cli)
    _check_places(views)
    assert all(v["distributed"] == "DistributedType.MULTI_CPU" for v in views)
