"""Helpers shared by commands: consoles, a spinner, model references, the command line."""

from __future__ import annotations

import csv
import enum
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from autodeploy import intake
from autodeploy.api import cache_dir
from autodeploy.errors import UsageError
from autodeploy.intake import ResolvedModel
from autodeploy.redact import mask_secrets
from autodeploy.units import fmt_ms, fmt_ms_ci, fmt_pct

if TYPE_CHECKING:
    from autodeploy.harness.timing import TimingPolicy

__all__ = ["DataOption", "Format", "FormatOption", "ResolvedModel", "cache_dir", "command_line", "emit", "err", "fmt_ms",
           "fmt_ms_ci", "fmt_pct", "data_of", "engine_noise", "out", "plain", "quiet_engines", "resolve_model", "shown", "spinner"]  # fmt: skip

#: Piped or redirected output is never cut to 80 columns: tables keep every cell whole.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 100_000)
err = Console(stderr=True, highlight=False)
#: C0 and C1 control characters (an ANSI escape in a model's name must not drive the terminal) and the
#: bidirectional marks, embeddings, overrides and isolates (U+202E makes ``exe.onnx`` read as ``xnno.exe``).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


#: Engines' own log levels when not -v (TensorFlow and the LiteRT converter read it); workers inherit it.
#: What engines print straight to fd 2 while loading in this process is hidden by :func:`engine_noise`.
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}
_quiet = True


def quiet_engines(quiet: bool) -> None:
    """Silence the engines' own logging (their INFO lines are not ours to show) unless ``-v``."""
    global _quiet
    _quiet = quiet
    for name, value in _QUIET_ENV.items():
        if quiet:
            os.environ.setdefault(name, value)


def verbose() -> bool:
    """Whether ``-v`` was given: the engines' own lines and the converters' logs are shown."""
    return not _quiet


#: With ``-v``, a failed TFLite conversion shows this many of its first rung's onnx2tf log lines.
LOG_TAIL_LINES = 40


def print_converter_logs(reason: str | None) -> None:
    """With ``-v``, under a failure whose reason names kept onnx2tf logs (a failed TFLite conversion):
    each rung's log path, and the last :data:`LOG_TAIL_LINES` lines of the first rung's, the ladder's
    main conversion, whose reason leads the message. The one-line reason keeps only onnx2tf's error
    lines; what the converter did before them is in the log."""
    if _quiet:
        return
    from autodeploy.adapters.tflite import kept_logs, log_lines

    logs = kept_logs(reason)
    for i, log in enumerate(logs):
        err.print(f"onnx2tf log, rung {i}: {shown(log)}", soft_wrap=True)
    if logs:
        err.print(f"[dim]last {LOG_TAIL_LINES} lines of {shown(logs[0].name)}:[/dim]")
        for line in log_lines(logs[0], LOG_TAIL_LINES):
            err.print(f"  {shown(line)}", soft_wrap=True)


@contextmanager
def engine_noise() -> Iterator[None]:
    """Hide what engine C++ code writes straight to file descriptor 2 (e.g. LiteRT's ``INFO: Created
    TensorFlow Lite XNNPACK delegate``) while an engine loads in this process; shown with ``-v``."""
    if not _quiet:
        yield
        return
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        _flush_c_streams()  # a pipe makes C's stderr buffered: flush it into /dev/null, not after the restore
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _flush_c_streams() -> None:
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to flush (not POSIX): nothing was buffered by it either
        pass


def plain(value: object, *, keep: str = "") -> str:
    """Text from models, files and users with its control characters made visible (``\\x1b``, ``\\u202e``):
    for output that is not Rich markup (CSV cells, plain reports). ``keep`` names characters left as they are
    (``"\\n"`` for a multi-line report)."""
    return _CONTROL.sub(lambda m: m.group() if m.group() in keep else repr(m.group())[1:-1], str(value))


def shown(value: object) -> str:
    """Text from models, files and users, safe to print with Rich: control characters made visible, markup
    escaped. Every untrusted string that reaches ``out``/``err``, a table title or a cell goes through it."""
    return escape(plain(value))


def resolve_model(ref: str, shapes: dict[str, tuple[int, ...]]) -> ResolvedModel:
    """:func:`autodeploy.intake.resolve_model`, with a spinner while a zoo model is built."""
    with spinner() as show:
        return intake.resolve_model(ref, shapes, progress=show)


@contextmanager
def spinner() -> Iterator[Callable[[str], None]]:
    """A spinner on stderr that appears on the first message and is gone at the end."""
    status: Status | None = None

    def show(text: str) -> None:
        nonlocal status
        if status is None:
            status = err.status(shown(text))
            status.start()
        else:
            status.update(shown(text))

    try:
        yield show
    finally:
        if status is not None:
            status.stop()


def command_line() -> str:
    """The command as typed, for the store (so a result can be reproduced), with every URL's password masked."""
    return mask_secrets(shlex.join(["autodeploy", *sys.argv[1:]]))


class Format(str, enum.Enum):
    """How a command prints its result: a table for people, JSON or CSV for programs."""

    table = "table"
    json = "json"
    csv = "csv"


FormatOption = Annotated[Format, typer.Option("--format", case_sensitive=False,
                         help="table for people; json (schema: `autodeploy schema`) or csv for programs.")]  # fmt: skip


def emit(fmt: Format, records: Mapping[str, Any] | list[Mapping[str, Any]]) -> None:
    """Print ``records`` (one record or a list) as JSON, or as CSV rows with a header, on stdout."""
    from autodeploy.report import strict_json, to_csv_rows

    if fmt is Format.json:  # strict JSON: a non-finite number (an SQNR of a bit-exact output) is null
        sys.stdout.write(strict_json(records, indent=2, default=str) + "\n")
        return

    columns, rows = to_csv_rows([records] if isinstance(records, Mapping) else records)
    writer = csv.DictWriter(sys.stdout, fieldnames=[csv_cell(c) for c in columns], lineterminator="\n")
    writer.writeheader()
    writer.writerows({csv_cell(k): csv_cell(v) for k, v in row.items()} for row in rows)


def csv_cell(value: Any) -> Any:
    """A CSV cell safe to open: control characters made visible, and text a spreadsheet would run as a formula
    (``=``, ``+``, ``-``, ``@`` first, OWASP's rule) prefixed with ``'``; numbers, text that reads as one, and
    a lone ``-`` are kept as they are."""
    if not isinstance(value, str):
        return value
    value = plain(value)
    if len(value) > 1 and value[0] in ("=", "+", "-", "@"):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


#: ``--data`` and the image preprocessing flags, as every command that takes inputs reads them
#: (bench, tune, bundle run, inhouse quantize, gate), in benchmark_app's words (autodeploy/images.py).
DataOption = Annotated[str | None, typer.Option(help="Input data: .npz, a .npy (a model with one input), a folder of NAME.npy (plus optional 'labels'), a folder "
                                                "of images (subfolders: classes), or sample:images (crops of real photos).")]  # fmt: skip
LayoutOption = Annotated[str | None, typer.Option(help="Image layout of the input, NCHW or NHWC (default: from the model).")]
ReverseOption = Annotated[bool, typer.Option("--reverse-input-channels", help="Feed images as BGR, not RGB.")]
MeanOption = Annotated[str | None, typer.Option(help="Per-channel values subtracted from 0..255 pixels, e.g. [123.675,116.28,103.53].")]
ScaleOption = Annotated[str | None, typer.Option(help="Per-channel values the pixels are then divided by, e.g. [58.395,57.12,57.375].")]
MetricOption = Annotated[str | None, typer.Option(help="Task metric FILE.py:FUNCTION (your own file) receiving (outputs, labels), higher is better; reported beside accuracy.")]
AccuracyOption = Annotated[list[str] | None, typer.Option(help="OUTPUT=MEASURE[:THRESHOLD]: judge OUTPUT by MEASURE (exact, top1, sequence, decision, embedding, sqnr, cosine) instead of the kind found from the graph; THRESHOLD is decision's probability cut or sqnr's dB limit. Repeatable.")]
#: The accuracy budget, in the same words for bench and tune (what each output is judged by: README).
ACCURACY_DROP_HELP = ("Accuracy budget per output, as a fraction (default 1%): each output's measure (top-1, exact, "
                      "sequence, F1 of decisions, SQNR per channel group) may lose at most this much.")


def at_least(low: float) -> Callable[[Any, Any, float | None], float | None]:
    """Callback for a float option with a lower bound. Typer's own ``min=`` is not used on floats: it is checked
    before the app's finite-number check (``nan`` got a range error box) and prints a multi-line box."""

    def check(ctx: Any, param: Any, value: float | None) -> float | None:
        if value is not None and value < low:
            flag = param.opts[0] if param.opts else param.name
            raise UsageError(f"{flag} {value:g} is below {low:g}", fix=f"give {flag} at least {low:g}")
        return value

    return check


def timing_flags(min_samples: int, min_duration: float, max_duration: float) -> TimingPolicy:
    """``--min-samples``, ``--min-duration`` and ``--max-duration`` as a timing policy, each checked against its
    bounds first, so a bad one is one line naming the flag (bench, bundle run). Raises: UsageError."""
    from autodeploy.harness.timing import MAX_TIMED_S, TimingPolicy

    cap = TimingPolicy.max_samples
    if not 2 <= min_samples <= cap:
        raise UsageError(f"--min-samples {min_samples} is outside 2..{cap:,} (the harness times at most {cap:,} calls)",
                         fix=f"give --min-samples between 2 and {cap}; for a longer run raise --min-duration")  # fmt: skip
    if not 0 < max_duration <= MAX_TIMED_S:
        raise UsageError(f"--max-duration {max_duration:g} is outside 0..{MAX_TIMED_S:g} seconds",
                         fix="give a positive number of seconds, at most a day, e.g. --max-duration 60")  # fmt: skip
    if not 0 <= min_duration <= max_duration:
        raise UsageError(f"--min-duration {min_duration:g} is outside 0..{max_duration:g} seconds (--max-duration)",
                         fix="give --min-duration at most --max-duration, e.g. --min-duration 2")  # fmt: skip
    return TimingPolicy(min_samples=min_samples, min_duration_s=min_duration, max_duration_s=max_duration)


MetricDropOption = Annotated[float | None, typer.Option(help="Largest drop of --metric from the FP32 reference's allowed (default: only reported).")]


def data_of(source: str | None, info: Any, layout: str | None, reverse: bool, mean: str | None, scale: str | None,
            *, default: Any = None) -> Any:  # fmt: skip
    """The :class:`~autodeploy.data.Dataset` that ``--data`` and the preprocessing flags give
    (:func:`autodeploy.intake.load_source`, the path bench and tune take), or ``None`` without ``--data``.

    ``default`` is the :class:`~autodeploy.images.Preprocess` for images when no flag is given (a
    bundle's, as it was measured); arrays never get it.
    """
    from autodeploy import images
    from autodeploy.intake import load_source

    preprocess = preprocess_of(layout, reverse, mean, scale)
    if preprocess is None and source is not None and default is not None:
        is_images = source == images.SAMPLE_IMAGES or images.is_image_folder(Path(source))
        preprocess = default if is_images else None
    return load_source(source, info, preprocess)


def preprocess_of(layout: str | None, reverse: bool, mean: str | None, scale: str | None) -> Any:
    """The :class:`~autodeploy.images.Preprocess` the flags ask for, or ``None`` when none was given."""
    from autodeploy.images import Preprocess, parse_values

    if layout is None and not reverse and mean is None and scale is None:
        return None
    return Preprocess(layout.upper() if layout else None, reverse, parse_values(mean, "--mean-values"),
                      parse_values(scale, "--scale-values"))  # fmt: skip


def judged_by(o: Any) -> str:
    """An output's kind and its measure's value, as a table cell: ``sqnr: 0.0 dB (axis 1, channels 4-21)``."""
    from autodeploy.accuracy import rules

    if o.kind is None:
        return "-"
    measure = rules.output_measure(o)
    value = measure.value(o)
    shown = f"{value:.1f} {measure.unit}" if measure.db else rules.fraction(value)
    where = f" ({o.channels})" if o.channels else ""
    if measure.probability:
        where = f" at {o.decision_threshold:g}"
    if measure.tokens and o.token_agreement is not None:
        where = f" (tokens {rules.fraction(o.token_agreement)})"
    every = measure.every_flip(o)
    if every is not None and every != value:  # under the names the JSON record gives them
        where = f" where the reference decided ({measure.field}; every flip: {rules.fraction(every)}, {measure.every})"
    if measure.db and o.error_max_abs is not None:  # the error in the output's own units
        where += f", max abs error {o.error_max_abs:.4g}"
    return f"{measure.name}: {measure.metric} {shown}{where}"


def load_text(load: Any) -> str:
    """A :class:`~autodeploy.harness.load.Load` for a table cell: its text, flagged when the machine was under load."""
    return f"{load.text()} [yellow](under load)[/]" if load.under_load else f"{load.text()} (quiet)"
