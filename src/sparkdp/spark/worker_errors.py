"""Worker errors on their way to the driver: what a failed Spark task says, as a sparkdp error.

A worker encodes its exception (:func:`encode_error`) into the error Spark carries to the
driver; the driver turns Spark's failure text back into a typed error (:func:`translate_error`):
the worker's own, or a readable line for what Spark reports (a lost worker, a missing module).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import traceback

from ..errors import (
    ConfigError,
    DataError,
    EnvironmentProblem,
    RendezvousTimeout,
    SparkdpError,
    TrainingDiverged,
    WorkerFailed,
    WorkerHung,
    WorkerLost,
    WorkerOutOfMemory,
    WorkerPreempted,
)
from ..train.memory import is_out_of_memory, memory_limit_bytes

log = logging.getLogger(__name__)

_ERROR_MARK = "SPARKDP_WORKER_ERROR"
#: errors a worker raises whose message is the whole story (WorkerLost: a retried asynchronous
#: task that stops at once, so that the driver's restart policy decides; WorkerPreempted: every
#: rank saved and stopped, so that the controller restarts without counting it)
_REBUILDABLE = {
    cls.__name__: cls
    for cls in (
        ConfigError,
        DataError,
        EnvironmentProblem,
        RendezvousTimeout,
        TrainingDiverged,
        WorkerLost,
        WorkerPreempted,
    )
}


def encode_error(rank: int, exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    message = str(exc)
    if isinstance(exc, SystemExit):
        message = (
            f"the code called sys.exit({exc.code!r}) on this worker (an argparse error exits with 2: "
            f"check the arguments the workers see in sys.argv)"
        )
    elif isinstance(exc, ModuleNotFoundError):
        message = (
            f"{message} (the executor's interpreter is {sys.executable}: install {exc.name!r} there, or "
            "point PYSPARK_PYTHON at an interpreter that has it)"
        )
    payload = {"rank": rank, "type": type(exc).__name__, "message": message, "traceback": "".join(tb[-6:])}
    if is_out_of_memory(exc):  # read here: the limit is this worker's, not the driver's
        payload.update(type=WorkerOutOfMemory.__name__, limit=memory_limit_bytes())
    # base64: survives whatever quoting Spark and py4j apply to the message on its way to the driver;
    # the readable line before it is what Spark's own log shows
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return (
        f"sparkdp worker {rank} failed: {type(exc).__name__}: {first} "
        f"{_ERROR_MARK}<<{base64.b64encode(json.dumps(payload).encode()).decode()}>>"
    )


def udf_error(exc: BaseException, what: str) -> SparkdpError:
    """The one-line error a DataFrame function's Python worker raises (``raise udf_error(...)
    from None``) in place of ``exc``: the action that ran it (``collect``, ``write``) shows Python's
    short traceback ending in this line, not the model's or transformers' whole stack. sparkdp's
    own errors keep their type and words; anything else becomes a :class:`WorkerFailed` naming
    its type, its first line and what was running."""
    if isinstance(exc, SparkdpError):
        return type(exc)(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    first = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
    hint = (
        "; a CUDA or allocation failure: lower batch_size"
        if is_out_of_memory(exc)
        else "; check the columns and the model with a few rows on the driver"
    )
    return WorkerFailed(f"{what} failed on an executor: {type(exc).__name__}: {first}{hint}.")


def _decode_error(text: str) -> SparkdpError | None:
    match = re.search(_ERROR_MARK + r"<<([A-Za-z0-9+/=]+)>>", text)
    if not match:
        return None
    try:
        info = json.loads(base64.b64decode(match.group(1)))
    except (ValueError, json.JSONDecodeError):
        return None
    cls = _REBUILDABLE.get(info["type"])
    if cls is not None:
        return cls(info["message"])
    if info["type"] == WorkerOutOfMemory.__name__:
        detail = f"{info['message']}\n{info['traceback']}"
        return out_of_memory(f"worker {info['rank']}", info.get("limit"), detail, info["rank"])
    if info["type"] == WorkerHung.__name__:  # the worker named the stalled one: that is the whole story
        hung = WorkerHung(info["message"])
        hung.rank = info["rank"]
        return hung
    err = WorkerFailed(
        f"worker {info['rank']} failed: {info['type']}: {info['message']}\n{info['traceback']}"
    )
    err.rank = info["rank"]
    return err


def translate_error(exc: BaseException, requested: int, master: str) -> BaseException:
    text = str(exc)
    decoded = _decode_error(text)
    if decoded is not None:
        return decoded
    if "more slots than the total number of slots" in text or "SPARK-24819" in text:
        return RendezvousTimeout(
            f"requested {requested} workers, but Spark master {master!r} has fewer task slots right now, and a "
            f"synchronous job needs all {requested} running together. Use fewer workers, or add executors/cores."
        )
    if isinstance(exc, SparkdpError):
        return exc
    if "OPERATION_CANCELED" in text:  # Spark Connect's answer to interruptTag/interruptAll
        return WorkerFailed(
            f"the Spark job of {requested} worker(s) was cancelled (its operation was interrupted "
            "on the Spark Connect session); the session stays usable."
        )
    if "RESOURCE_EXHAUSTED" in text and "message larger than max" in text:
        size = re.search(r"\((\d+) vs\. (\d+)\)", text)
        sizes = (
            f" ({int(size.group(1)) >> 20} MiB, the limit is {int(size.group(2)) >> 20} MiB)" if size else ""
        )
        return ConfigError(
            f"the job's tasks are too large for a Spark Connect message{sizes}: the model and any "
            "arrays given to fit travel inside the job's plan over gRPC. Pass the data as a Spark "
            "DataFrame or a Parquet path instead of in-memory arrays, or raise the limit on both ends "
            "(spark.connect.grpc.maxInboundMessageSize on the server, grpc.max_send_message_length "
            "on the client's channel)."
        )
    log.info("the Spark job failed with:\n%s", text)
    task = re.search(r"ResultTask\(\d+, (\d+)\)|[Tt]ask (\d+)(?:\.\d+)? in stage", text)
    who = f"worker {next(g for g in task.groups() if g is not None)}" if task else "a worker"
    too_large = result_too_large(text, master)
    if too_large is not None:
        return too_large
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if missing:  # raised while the executor unpickled the task, before any sparkdp code ran there
        return EnvironmentProblem(missing_module_message(missing.group(1), who, text))
    if _OUT_OF_MEMORY.search(text):
        return out_of_memory(who, None, "", None)
    for pattern, kind, what in _SPARK_FAILURES:
        if pattern in text:
            return kind(f"{who} {what} (the full Spark error is logged with -v).")
    # Otherwise keep what Spark says, without py4j's wrapper line and the JVM stack frames.
    lines = [
        ln
        for ln in text.strip().splitlines()
        if ln.strip()
        and not ln.lstrip().startswith(("at ", "..."))
        and "An error occurred while calling" not in ln
    ]
    summary = "\n".join(lines[:8]) if lines else type(exc).__name__
    return WorkerFailed(f"the Spark job failed: {summary[:2000]}")


def result_too_large(text: str, master: str) -> ConfigError | None:
    """The error for tasks' results the driver could not take (a trained model's whole state
    travels back from rank 0), naming the setting to raise; None when ``text`` is another failure.

    Over ``spark.driver.maxResultSize`` Spark says so itself. Out of heap, it says less: the
    driver's JVM copies a result several times on its way to Python, and an allocation that fails
    while it reads one surfaces as ``java.io.StreamCorruptedException``/``IllegalStateException:
    unread block data`` or a ``java.lang.OutOfMemoryError``. On a local master the executors live
    in the driver's JVM, so every JVM heap error there is the driver's."""
    if "spark.driver.maxResultSize" in text:
        sizes = re.search(r"\(([^()]+)\) is bigger than spark\.driver\.maxResultSize \(([^()]+)\)", text)
        figures = f" ({sizes.group(1)}, the limit is {sizes.group(2)})" if sizes else ""
        return ConfigError(
            f"the tasks' results are larger than spark.driver.maxResultSize{figures}: rank 0 returns the "
            "trained model's whole state to the driver. Raise it when the session starts, e.g. "
            "sparkdp.session(conf={'spark.driver.maxResultSize': '4g'}) or spark-submit --conf "
            "spark.driver.maxResultSize=4g, with spark.driver.memory larger still (docs/guide/reliability.md)."
        )
    local = master.startswith("local")
    if "unread block data" in text or (local and "java.lang.OutOfMemoryError" in text):
        return ConfigError(
            "the driver's JVM ran out of heap while it took the tasks' results (Spark reports it as "
            "'unread block data' or java.lang.OutOfMemoryError): rank 0 returns the trained model's whole "
            "state, and the JVM holds a few copies of it on its way to Python. Raise spark.driver.memory "
            "before the session starts, e.g. sparkdp.session(conf={'spark.driver.memory': '8g'}) or "
            "spark-submit --driver-memory 8g (docs/guide/reliability.md)."
        )
    return None


def out_of_memory(who: str, limit: int | None, detail: str, rank: int | None) -> WorkerOutOfMemory:
    """The one line for a worker that ran out of memory (the driver's fit adds what the model's
    state needs: driver/memory_advice.py); the worker's own error is logged at info level."""
    from ..costmodel import size_text

    if detail:
        log.info("%s ran out of memory: %s", who, detail)
    bound = f"limit {size_text(limit)}" if limit else "no limit it could read: the machine's memory"
    err = WorkerOutOfMemory(
        f"{who} ran out of memory ({bound}): the model's state (parameters, gradients, optimizer "
        "state) may not fit one worker beside its batch; strategy='fsdp' shards it over the workers "
        "(docs/guide/strategies.md)"
    )
    err.rank, err.limit_bytes = rank, limit
    return err


def missing_module_message(module: str, who: str, text: str) -> str:
    """What to do when an executor's Python lacks a module the job needs (the peers' most common failure)."""
    where = re.search(r"\(([^\s()]+) executor ([^\s()]+)\)", text)
    place = f" (host {where.group(1)}, executor {where.group(2)})" if where else ""
    # a Python worker that could not even start names its interpreter ("/usr/bin/python3: Error while ...")
    python = re.search(r"(/\S+): (?:Error while finding module|No module named)", text)
    interpreter = f" ({python.group(1)})" if python else ""
    top = module.split(".")[0]
    return (
        f"{who}{place} could not import {module!r}: the executors' Python{interpreter} does not have {top!r}. Install "
        f"it on every node with the same interpreter (spark.pyspark.python / PYSPARK_PYTHON), ship your own "
        "modules with --py-files or SparkContext.addPyFile, or ship a whole environment: venv-pack -o env.tar.gz, "
        "then --conf spark.archives=env.tar.gz#env and PYSPARK_PYTHON=./env/bin/python (docs/guide/clusters.md)."
    )


# What Spark's error text says -> one readable line (translate_error)
_SPARK_FAILURES: tuple[tuple[str, type[WorkerFailed], str], ...] = (
    (
        "Python worker exited unexpectedly",
        WorkerLost,
        "died: its Python process exited unexpectedly (killed, or crashed in native code)",
    ),
    (
        "OutOfMemoryError",
        WorkerFailed,
        "ran out of memory in the JVM; give executors more memory (spark.executor.memory)",
    ),
    ("ExecutorLostFailure", WorkerLost, "was lost with its executor (the machine or its JVM went away)"),
)

#: Spark's words for a Python worker that ran out of memory before sparkdp could say so itself
#: (unpickling its task, or killed by the cluster manager for exceeding its memory); the JVM's
#: own java.lang.OutOfMemoryError is another matter (_SPARK_FAILURES)
_OUT_OF_MEMORY = re.compile(
    r"(?<!OutOf)MemoryError"
    r"|DefaultCPUAllocator: can't allocate memory|CUDA out of memory"
    r"|exceeding memory limits"  # YARN: "Container killed by YARN for exceeding memory limits"
    r"|OOMKilled"  # Kubernetes: the executor pod's container was killed by the OOM killer
)
