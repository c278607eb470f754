"""What ``sparkdp launch`` ships of a script's directory to executors elsewhere (``sparkdp.spark.files``):
the zip Spark receives is opened and its names and bytes compared with the files on disk."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from sparkdp.errors import ConfigError
from sparkdp.spark import files as shipping
from sparkdp.spark.files import IGNORE_FILE, ship_directory, shipped_files

pytestmark = pytest.mark.timeout(60)


class _Spark:
    """A session's ``addArtifacts``: keeps the archive it is given (Spark would copy it to executors)."""

    def __init__(self) -> None:
        self.archives: list[tuple[str, bool]] = []

    def addArtifacts(self, path: str, archive: bool = False) -> None:  # noqa: N802 - Spark's name
        self.archives.append((path, archive))


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _zipped(spark: _Spark) -> dict[str, bytes]:
    (path, archive), *_ = spark.archives
    assert archive is True
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_hidden_files_and_directories_stay_behind(tmp_path):
    job = _tree(
        tmp_path / "job",
        {
            "train.py": "print('train')",
            "helpers/model.py": "X = 1",
            ".env": "AWS_SECRET_ACCESS_KEY=leaked",
            ".aws/credentials": "[default]\naws_secret_access_key = leaked",
            ".ssh/id_ed25519": "PRIVATE KEY",
            ".git/config": "[core]",
            "helpers/.netrc": "machine h password leaked",
        },
    )
    spark = _Spark()
    shipment = ship_directory(spark, str(job))
    assert _zipped(spark) == {"helpers/model.py": b"X = 1", "train.py": b"print('train')"}
    assert shipment.files == ("helpers/model.py", "train.py")
    assert shipment.skipped == (".aws/", ".env", ".git/", ".ssh/", "helpers/.netrc")
    assert shipment.size == len("X = 1") + len("print('train')")
    assert shipment.name == Path(spark.archives[0][0]).name and shipment.name.startswith("job-")


def test_a_sparkdpignore_names_what_stays_behind_and_what_ships_after_all(tmp_path):
    job = _tree(
        tmp_path / "job",
        {
            IGNORE_FILE: "# data lives on shared storage\n\n*.csv\n/build/\ncache/\nnotes/draft*.md\n"
            "!keep.csv\n!.flake8\n",
            "train.py": "t",
            "a.csv": "1",
            "sub/b.csv": "2",
            "keep.csv": "3",
            "build/out.bin": "4",
            "sub/build/tool.py": "5",  # '/build/' is anchored: only the top-level build/ stays behind
            "cache/x": "6",
            "sub/cache/y": "7",  # 'cache/' matches a directory named cache at any depth
            "notes/draft1.md": "8",
            "notes/final.md": "9",
            "sub/notes/draft2.md": "10",  # an anchored pattern matches from the directory only
            "notes/cache": "c",  # 'cache/' names directories only: a file called cache ships
            ".flake8": "[flake8]",  # a hidden file shipped on purpose
        },
    )
    files, skipped = shipped_files(str(job))
    assert files == [
        ".flake8",
        "keep.csv",
        "notes/cache",
        "notes/final.md",
        "sub/build/tool.py",
        "sub/notes/draft2.md",
        "train.py",
    ]
    assert skipped == [
        IGNORE_FILE,  # hidden: the rules themselves stay on the driver
        "a.csv",
        "build/",
        "cache/",
        "notes/draft1.md",
        "sub/b.csv",
        "sub/cache/",
    ]


def test_a_link_out_of_the_directory_is_not_followed(tmp_path):
    secret = tmp_path / "home" / ".aws" / "credentials"
    secret.parent.mkdir(parents=True)
    secret.write_text("aws_secret_access_key = leaked")
    job = _tree(tmp_path / "job", {"train.py": "t", "lib/util.py": "u"})
    (job / "creds").symlink_to(secret)
    (job / "home").symlink_to(tmp_path / "home", target_is_directory=True)
    (job / "util.py").symlink_to(job / "lib" / "util.py")  # a link inside the directory ships
    spark = _Spark()
    shipment = ship_directory(spark, str(job))
    assert _zipped(spark) == {"lib/util.py": b"u", "train.py": b"t", "util.py": b"u"}
    assert shipment.skipped == ("creds", "home/")


def test_only_the_files_shipped_count_towards_the_limit_and_the_archive_name(tmp_path, monkeypatch):
    job = _tree(tmp_path / "job", {"train.py": "t" * 10, ".venv/big.bin": "x" * 1000})
    monkeypatch.setattr(shipping, "MAX_SHIPPED_BYTES", 100)
    first = ship_directory(_Spark(), str(job))
    (job / ".venv" / "big.bin").write_text("y" * 1000)  # a change to what stays behind
    assert ship_directory(_Spark(), str(job)).name == first.name
    (job / "train.py").write_text("u" * 10)  # a change to what ships is a new archive
    assert ship_directory(_Spark(), str(job)).name != first.name
    (job / "data.bin").write_text("d" * 200)
    with pytest.raises(
        ConfigError, match=r"holds 0 MB to ship.*or name what stays behind in \.sparkdpignore"
    ):
        ship_directory(_Spark(), str(job))


SCRIPT = """\
import json, os, sys
here = os.path.dirname(os.path.abspath(sys.argv[0]))
import helper
print("SEEN", json.dumps(sorted(os.listdir(here))))
print("HELPER", helper.VALUE)
"""


@pytest.mark.timeout(180)
def test_launch_on_a_cluster_ships_the_listed_files_and_the_run_log_names_them(
    spark, tmp_path, monkeypatch, capsys
):
    """``launch`` as on a cluster master (the executors are told the driver's files are not
    theirs): the script runs from the unpacked archive, which lacks ``.env``, and the run log's
    header and stderr say what was shipped."""
    import sparkdp
    import sparkdp.spark.cluster as cluster

    job = _tree(
        tmp_path / "job",
        {"train.py": SCRIPT, "helper.py": "VALUE = 42\n", ".env": "TOKEN=leaked", IGNORE_FILE: "*.log\n"},
    )
    (job / "run.log").write_text("old output")
    monkeypatch.setattr(cluster, "on_driver_machine", lambda session: False)
    sparkdp.launch(job / "train.py", workers=1, spark=spark, run_dir=str(tmp_path / "run"))
    out, err = capsys.readouterr()
    seen = json.loads(next(line for line in out.splitlines() if "SEEN " in line).split("SEEN ", 1)[1])
    assert seen == ["helper.py", "train.py"] and "HELPER 42" in out, out
    header = json.loads((tmp_path / "run" / "run.jsonl").read_text().splitlines()[0])["config"]
    assert header["shipped_files"] == ["helper.py", "train.py"]
    assert header["not_shipped"] == [".env", IGNORE_FILE, "run.log"]
    assert f"sparkdp: shipped 2 file(s), 0.0 MB, of {job} to the executors; left out 3" in err
