"""Small helpers the CLI commands share: error handling, JSON output, rich tables."""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Optional, get_args

import click
import typer
from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from clustersim.errors import InputError
from clustersim.units import on_off

PIPED_WIDTH = 10_000  # characters per line when the output is a file or a pipe: nothing wraps or is cut
PROGRESS_EVERY_S = 5.0  # off a terminal, a plain progress line on stderr at least this often ...
PROGRESS_STEP = 0.1  # ... and at every further 10% of the work,
PROGRESS_MIN_GAP_S = 1.0  # but at most one line a second (a short job prints only its last line)
# No estimate of the time left before this share of the work is done: the first items of a plan carry
# its start-up (forking the workers, their first programs) and some of its slowest candidates, so a
# rate measured on the first tenth said ~16 s left of an 8 s run; past a fifth, the start-up weighs half
# as much and the candidates are a wider sample (a presentation rule, not a model constant).
ETA_AFTER = 0.2
HEARTBEAT_AFTER_S = 2.0  # a command silent longer than this looks hung: say it is working (heartbeat)


class CliConsole(Console):
    """A rich console that, when its output is not a terminal (a pipe, a file, a test runner), is as wide
    as any line: tables and sentences come out whole, one line each, instead of wrapped at 80 columns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "width" not in kwargs:
            # rich takes COLUMNS as a fixed width; CI systems export it for logs that are no terminal.
            # On a terminal rich measures it anyway, and off one lines stay whole (below).
            self._width = None

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is None and not self.is_terminal and not self.is_jupyter:
            return ConsoleDimensions(PIPED_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = CliConsole()
err_console = CliConsole(stderr=True)


def value_metavar(param: click.Parameter) -> str:
    """What --help shows for a parameter's value: nothing for a flag, else an upper-case word (PATH, INTEGER,
    NUMBER, TEXT, the argument's name; FILE... for a list of files)."""
    if getattr(param, "is_flag", False):
        return ""
    desc = getattr(param, "type_descriptor", None)  # typer's view of the annotation
    annotation = desc.annotation if desc is not None else None
    several = param.nargs != 1 or getattr(param, "multiple", False) or bool(desc and desc.is_list)
    if desc is not None and desc.is_list:
        annotation = (get_args(annotation) or (str,))[0]
    if param.param_type_name == "argument":
        word = (param.name or "value").upper()
    elif isinstance(annotation, type) and issubclass(annotation, PurePath):
        word = "FILE" if several else "PATH"
    elif desc is not None and desc.is_choice:
        word = "|".join(map(str, desc.choices))
    elif annotation is int:
        word = "INTEGER"
    elif annotation is float:
        word = "NUMBER"
    elif desc is None and isinstance(getattr(param, "type", None), click.ParamType):  # typer before 0.29
        name = param.type.name.split()[0]
        word = {"integer": "INTEGER", "float": "NUMBER", "path": "PATH"}.get(name, "TEXT")
    else:
        word = "TEXT"
    return word + ("..." if several else "")


def tidy_help(command: click.Command) -> None:
    """Plain metavars in every command's --help (typer would show ``<bool>``, ``<list[Path]>``, ``<str>``)."""
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
        if sub.help and not sub.short_help:  # the command list shows the first paragraph as one line
            sub.short_help = " ".join(sub.help.split("\n\n")[0].split())
    for param in command.params:
        param.metavar = value_metavar(param)
        if param.param_type_name == "argument":  # its metavar is the name column; no type column
            param.display_type_rich = lambda ctx=None: None
    plain_help_option = command.get_help_option

    def get_help_option(ctx: click.Context):
        option = plain_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option


class _TidyParams(list):
    """A command's parameter list that gives a parameter appended later its plain metavar: typer adds
    --install-completion and --show-completion after the group is built."""

    def append(self, param: click.Parameter) -> None:
        param.metavar = value_metavar(param)
        super().append(param)


class HelpfulGroup(TyperGroup):
    """The top-level command group: tidies every command's help once the tree is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        tidy_help(self)
        self.params = _TidyParams(self.params)


def one_line_usage_errors() -> None:
    """A bad option value (``--samples -1``, ``--global-batch 0``, an unknown option) is one line on stderr
    naming the option, and exit code 2, like every other bad input; typer prints a usage line, a hint and
    a boxed panel. Patched around typer's main loop (typer.core._main) so that no rich import is paid
    by commands that succeed."""
    import sys

    from typer import core

    if getattr(core._main, "_clustersim_one_line", False):
        return
    original = core._main

    def _main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return original(self, *args, standalone_mode=False, **kwargs)
        try:
            rv = original(self, *args, standalone_mode=False, **kwargs)
        except core.Exit as exc:
            sys.exit(exc.exit_code)
        except core._click.exceptions.ClickException as exc:
            if exc.__class__.__name__ == "NoArgsIsHelpError":  # typer printed the help already
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            from rich.markup import escape

            err_console.print(
                f"[bold red]error:[/] {escape(exc.format_message())}{hint}", highlight=False, soft_wrap=True
            )
            sys.exit(exc.exit_code)
        except core.Abort:
            err_console.print("Aborted.")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    _main._clustersim_one_line = True
    core._main = _main


def plain_help_when_piped() -> None:
    """``--help`` into a pipe or a file: panels without box borders (a log or a grep should see the text,
    not rounded corners). Patched into typer's help formatter on its first use, so commands that print no
    help import nothing more."""
    import sys

    if sys.stdout.isatty():
        return
    from typer import core

    def borderless(format_help):
        @functools.wraps(format_help)
        def wrapper(self, ctx, formatter):
            from rich import box
            from typer import rich_utils

            if not getattr(rich_utils, "_clustersim_plain", False):
                rich_utils.Panel = functools.partial(rich_utils.Panel, box=box.SIMPLE)
                rich_utils._clustersim_plain = True
            return format_help(self, ctx, formatter)

        return wrapper

    for cls in (core.TyperCommand, core.TyperGroup):
        if not getattr(cls.format_help, "_clustersim_plain", False):
            cls.format_help = borderless(cls.format_help)
            cls.format_help._clustersim_plain = True


def fail(message: str) -> None:
    """One error line on stderr, exit 2. The message is the user's text (paths, keys, op names), not
    markup: rich read '[slowest rank]' in an op's name, or a file called 'run[2].yaml', as a style tag
    and dropped it."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


NO_HEARTBEAT = {"testbed_exec"}  # its output is the user's own command's: no progress lines between


def _command_label(fn) -> str:
    """The command as typed after `clustersim` ('validate', 'calibrate run'), for progress lines: the
    function's name (`calibrate_run`, `plan_cmd`) spelled as the command."""
    return fn.__name__.removesuffix("_cmd").replace("_", " ")


def user_errors(fn):
    """Every command's frame: InputError as one line on stderr and exit code 2 (no traceback), and the
    heartbeat (progress on stderr for a command silent for HEARTBEAT_AFTER_S; none with --json, whose
    output is JSON only)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        quiet = bool(kwargs.get("json_out")) or fn.__name__ in NO_HEARTBEAT
        try:
            with heartbeat(_command_label(fn), disabled=quiet):
                return fn(*args, **kwargs)
        except InputError as exc:
            fail(str(exc))
        except OSError as exc:
            # a file the checks did not foresee failing (a folder made unreadable, a disk gone): the
            # file and what the system said, one line, instead of a traceback; other OSErrors (no file
            # named) are faults of this program and keep theirs
            if exc.filename is None or isinstance(exc, BrokenPipeError):
                raise
            fail(
                str(
                    InputError(
                        f"cannot access ({exc.strerror or exc.__class__.__name__})", source=str(exc.filename)
                    )
                )
            )

    return wrapper


def emit_json(data) -> None:
    """Print ``data`` as JSON. NaN and Infinity are not JSON: they are refused, never printed."""
    try:
        text = json.dumps(data, indent=2, default=str, allow_nan=False)
    except ValueError:
        fail("a result is not a finite number (NaN or infinity); check the inputs' magnitudes")
    sys.stdout.write(text + "\n")


def finite_option(value: float | None, key: str, *, positive: bool = True) -> float | None:
    """A numeric command option: a finite number (positive unless told), else one line naming it."""
    if value is None:
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        raise InputError(f"expected a finite{' positive' if positive else ''} number, got {value:g}", key=key)
    return value


def price_option(value: float | None, key: str = "--price") -> float | None:
    """A USD-per-GPU-hour option: finite, positive and within the catalog's limit for a GPU's price
    (hardware_defaults.yaml limits.price_per_gpu_hour, the same bound as a catalog entry's)."""
    from clustersim.catalog import beyond

    finite_option(value, key)
    why = value is not None and beyond(value, "price_per_gpu_hour", "USD per GPU-hour", "any real price")
    if why:
        raise InputError(why, key=key)
    return value


def table(
    title: str, columns: list[str], rows: list[list], justify_numbers: bool = True, left: int = 1
) -> RenderableType:
    """A rich table; the first ``left`` columns (names) are left-aligned, numbers right-aligned.

    Off a terminal it is plain text: the title on its own line, then the table with no box characters,
    columns separated by two spaces, each row whole on one line (see CliConsole)."""
    piped = not console.is_terminal
    if piped:
        t = Table(box=None, padding=(0, 1), pad_edge=False)
    else:
        t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="right" if (justify_numbers and i >= left) else "left")
    for r in rows:  # cells are text, not markup: a name like 'stage 0 [slowest rank]' prints whole
        t.add_row(*[x if isinstance(x, Text) else Text(_cell(x)) for x in r])
    return Group(Text(title), t) if piped else t


def _cell(x) -> str:
    """A table cell's text: counts with thousands separators (16,384 GPUs), a flag as on / off."""
    if isinstance(x, bool):
        return on_off(x)
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


ScenarioArg = typer.Argument(..., help="Scenario file (YAML/JSON) or preset:NAME.")


# How every command that prices a run (compare, report, plan) names its cost model, one text for all.
def _cost_option(rent_with: str) -> typer.models.OptionInfo:
    """--cost, its help naming the options that make a run rented in the command at hand (``rent_with``:
    compare has --instance only, report and plan --price too)."""
    return typer.Option(
        None,
        "--cost",
        help="Cost model: own (servers, network and power bought and amortised: catalogs/ownership.yaml) or "
        "rent (cloud instances as sold, network included: catalogs/instances.yaml); default: own where "
        f"catalogs/ownership.yaml prices every GPU, else rent; rent with {rent_with}.",
    )


CostOpt = _cost_option("--price or --instance")
CompareCostOpt = _cost_option("--instance")  # compare has no --price
InstanceOpt = typer.Option(
    None, "--instance", help="Rent this instance type (catalogs/instances.yaml), e.g. p5.48xlarge."
)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def _band_draws(value: int | None) -> int | None:
    """--samples' check beyond its range (simulator.uncertainty.draws_refusal): 1 draw is no band."""
    from clustersim.simulator.uncertainty import draws_refusal

    if value is not None and (why := draws_refusal(value)):
        raise typer.BadParameter(why)
    return value


def samples_option(default: int | None, help: str) -> typer.models.OptionInfo:
    """Every command's --samples: 0 (no band) or 2 to 1,000 draws (simulator.uncertainty.MAX_SAMPLES),
    one declaration so that each command refuses the same counts in the same words."""
    return typer.Option(default, "--samples", min=0, max=1000, callback=_band_draws, help=help)


SamplesOpt = samples_option(
    32,  # simulator.uncertainty.DEFAULT_SAMPLES, as every command
    "Draws of the uncertain parameters (calibration covariance or documented default widths) for the "
    "P10–P90 band; each re-runs the simulation. 0 turns the band off.",
)
ProfileOpt = typer.Option(
    None, "--profile", help="Calibration profile (file or builtin:NAME); measured costs win over defaults."
)


CatalogOpt = typer.Option(
    None,
    "--catalog",
    help="User catalog file (YAML): GPU entries in the shipped gpus.yaml schema and/or model entries in "
    "models.yaml's (e.g. from `clustersim models import`); they are added to the catalog, replacing "
    "shipped ones of the same name. Repeatable; a later file wins.",
)


def with_catalogs(fn):
    """Give a command the ``--catalog`` option: the user catalogs are in use while it runs."""
    sig = inspect.signature(fn)
    extra = inspect.Parameter(
        "catalogs", inspect.Parameter.KEYWORD_ONLY, default=CatalogOpt, annotation=Optional[list[Path]]
    )

    @functools.wraps(fn)
    def wrapper(*args, catalogs: Optional[list[Path]] = None, **kwargs):
        from clustersim.catalog import user_catalogs

        with user_catalogs(catalogs):
            return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])
    wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), "catalogs": Optional[list[Path]]}
    return wrapper


SetOpt = typer.Option(
    None,
    "--set",
    help="Change one scenario key for this command: KEY=VALUE, a dotted key and a YAML value "
    "(e.g. cluster.nic.line_rate_gbps=100 or workload.attention=eager). Repeatable; a later --set of "
    "the same key wins. Applied after the file or preset is read, and checked as the file is; a list's items "
    "(workload.layers) are not addressable.",
)

# numbers as a person types them: decimal, with a point or an exponent (1e3, which YAML 1.1 leaves a
# string); YAML 1.1's other forms (017 octal, 1:30 base 60, 0x10, 1_0) are refused, not reinterpreted
_PLAIN_INT = re.compile(r"[-+]?\d+")
_PLAIN_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _set_value(key: str, raw: str):
    """The value of ``--set key=raw``: a plain decimal number as written, YAML 1.1's yes/no/on/off
    words as the words (YAML 1.2 reads them so; true and false are the booleans), anything else as
    YAML. An empty value is refused: ``null`` resets a key to its default."""
    from clustersim.io import load_yaml

    text = raw.strip()
    if not text:
        raise InputError("no value after '=' (null resets the key to its default)", source="--set", key=key)
    if _PLAIN_INT.fullmatch(text):
        return int(text)
    if _PLAIN_FLOAT.fullmatch(text):
        return float(text)
    if text.lower() in _YAML11_BOOL_WORDS:
        return text
    try:
        value = load_yaml(text)
    except Exception as exc:  # a YAML syntax error in the value, as one line
        problem = getattr(exc, "problem", None)
        why = f"{type(exc).__name__}: {problem}" if problem else type(exc).__name__
        raise InputError(f"{_shown(raw)} is not a YAML value ({why})", source="--set", key=key) from None
    import yaml

    try:  # what YAML 1.1 makes of it (0x10, 1:30): said, since a file written so would surprise
        read_as = yaml.safe_load(text) if isinstance(value, str) else value
    except yaml.YAMLError:
        read_as = value
    if isinstance(read_as, int | float) and not isinstance(read_as, bool):
        raise InputError(
            f"{_shown(raw)} is not a plain decimal number (YAML 1.1 reads it as {read_as!r}); "
            "quote it for text",
            source="--set",
            key=key,
        )
    return value


# words YAML 1.1 (PyYAML) reads as booleans and YAML 1.2 as text
_YAML11_BOOL_WORDS = frozenset({"yes", "no", "on", "off", "y", "n"})


def _shown(raw: str, limit: int = 60) -> str:
    """``raw`` quoted for a message, cut to ``limit`` characters: an error names the value, it need not
    repeat a pasted file."""
    return repr(raw) if len(raw) <= limit else repr(raw[:limit]) + f"... ({len(raw):,} characters)"


def _check_set_path(key: str) -> None:
    """--set changes keys: a list index in the key (``workload.layers.0.params``) is refused here; a
    value or a list on the way (``cluster.gpu`` given by name) is refused by Scenario.with_changes."""
    if any(part.strip().lstrip("-").isdigit() for part in key.split(".")):
        raise InputError("--set changes keys, not a list's items (edit the file)", source="--set", key=key)


def load_scenario_ref(ref: str, settings: Optional[list[str]] = None):
    """``ref`` (a file or preset:NAME) with the ``--set KEY=VALUE`` changes applied; a malformed or
    invalid change is one line naming --set and the key, and a later check of a changed scenario names
    the changes beside the file."""
    from clustersim.scenario import load_scenario

    scenario = load_scenario(ref)
    if not settings:
        return scenario
    changes = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part.strip() for part in key.split(".")):
            raise InputError(
                f"{item!r} is not KEY=VALUE with a dotted key (e.g. workload.micro_batch=16)", key="--set"
            )
        changes[key] = _set_value(key, raw)
    for key in changes:
        _check_set_path(key)
    try:
        changed = scenario.with_changes(**changes)
    except InputError as exc:
        raise InputError(exc.message, source="--set", key=exc.key) from None
    changed._source = f"{scenario.source} with --set {', '.join(changes)}"
    return changed


def ms(t: float) -> str:
    return f"{t * 1e3:,.2f}"


_progress_shown = threading.Event()  # set when a command shows progress of its own (the heartbeat stops)
# When the command started (heartbeat): every phase's "elapsed" counts from it, so a command of several
# phases (compare's simulations, then its break-even) does not restart its clock at each.
_command_start: list[float | None] = [None]


def command_elapsed_origin() -> float:
    """The monotonic time a command's elapsed time counts from (now, outside a command)."""
    return _command_start[0] if _command_start[0] is not None else time.monotonic()


@contextmanager
def heartbeat(label: str, disabled: bool = False):
    """Progress for every command: one that has shown none of its own after HEARTBEAT_AFTER_S seconds
    gets a plain line on stderr then and every PROGRESS_EVERY_S seconds (``validate: working, 2.0 s
    elapsed``) until it ends or starts its own bar, spinner or progress lines. stdout is untouched."""
    if disabled:
        yield
        return
    _progress_shown.clear()
    stop = threading.Event()
    start = time.monotonic()
    _command_start[0] = start

    def beat() -> None:
        wait = HEARTBEAT_AFTER_S
        while not stop.wait(wait) and not _progress_shown.is_set():
            sys.stderr.write(f"{label}: working, {time.monotonic() - start:,.1f} s elapsed\n")
            sys.stderr.flush()
            wait = PROGRESS_EVERY_S

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _command_start[0] = None


def time_left(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left of ``total`` items, ``done`` of them in ``elapsed_s``, at the phase's rate so far;
    None before ETA_AFTER of the work is done. (The rate since the first tenth, start-up left out, was
    tried: a plan's candidates from 10% to 30% ran fastest of all, and it said 2 s where 5.8 s were
    left; the whole phase's rate said 4.4 s.)"""
    if not total or done < ETA_AFTER * total:
        return None
    return elapsed_s / done * max(0, total - done)


class PlainProgress:
    """Progress as plain lines on stderr, for when the output is not a terminal (a CI log, ``| tee``): a
    line at each further 10% of a known total (at most one per ``min_gap_s``) and at least every
    ``every_s`` seconds, e.g.
    ``sweep: 120/1000 rows, 12.3 s elapsed, ~90 s left``, and a last line when the work ends."""

    def __init__(
        self,
        label: str,
        unit: str = "",
        total: int | None = None,
        every_s: float = PROGRESS_EVERY_S,
        min_gap_s: float = PROGRESS_MIN_GAP_S,
    ):
        self.label, self.unit, self.total, self.every_s = label, unit, total, every_s
        self.min_gap_s = min_gap_s
        _progress_shown.set()
        self.done = 0
        self.message: str | None = None
        self._said: str | None = None  # the stage the last line printed
        self.phase_start = self.last_print = time.monotonic()
        self.start = command_elapsed_origin()  # elapsed: the command's; the estimate left: this phase's
        self._step = 0  # the last 10% mark printed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        if self.message is not None:
            # the same stage again: said to be still running, not repeated as if it had started anew
            still = " (still running)" if self.message == self._said else ""
            return f"{self.label}: {self.message}{still}, {elapsed:,.1f} s elapsed"
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            count = f"{self.done:,}{unit}, " if self.done else ""
            return f"{self.label}: {count}{elapsed:,.1f} s elapsed"
        text = f"{self.label}: {self.done:,}/{self.total:,}{unit}, {elapsed:,.1f} s elapsed"
        left = time_left(self.done, self.total, time.monotonic() - self.phase_start)
        if 0 < self.done < self.total and left is not None:
            text += f", ~{left:,.0f} s left"
        return text

    def _print(self) -> None:
        self.last_print = time.monotonic()
        sys.stderr.write(self.line() + "\n")
        sys.stderr.flush()
        self._said = self.message

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s)):
            with self._lock:
                if time.monotonic() - self.last_print >= self.every_s:
                    self._print()

    def update(self, done: int, total: int | None = None) -> None:
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            if not self.total:
                return
            step = int(done / self.total / PROGRESS_STEP)
            quiet = time.monotonic() - self.last_print < self.min_gap_s
            if step > self._step and done < self.total and not quiet:
                self._step = step
                self._print()

    def say(self, message: str) -> None:
        """The current stage of work of unknown length: the first is printed at once, then the ticker
        prints the latest every ``every_s`` seconds (a calibration has hundreds of stages)."""
        with self._lock:
            first = self.message is None
            self.message = str(message)
            if first:
                self._print()

    def close(self, finished: bool = True) -> None:
        """Stop the ticker; the last line says "done" only when the work ended (``finished``)."""
        self._stop.set()
        self._ticker.join()
        if not finished:
            return
        with self._lock:
            if self.message is None and self.total and self.done >= self.total:
                self._print()
            elif self.message is not None:
                self.message = "done"
                self._print()


@contextmanager
def progress_bar(label: str, unit: str = "", total: int | None = None, disabled: bool = False):
    """Progress of counted work; yields ``update(done, total=None)``. A rich bar with an ETA on a terminal,
    plain lines on stderr otherwise (PlainProgress), nothing when ``disabled`` (e.g. --json)."""
    if disabled:
        yield lambda done, total=None: None
        return
    _progress_shown.set()
    if not console.is_terminal:
        plain = PlainProgress(label, unit, total)

        def plain_update(done: int, total: int | None = None) -> None:
            plain.update(done, total)

        plain_update.say = plain.say  # a stage after the counted work (say_stage)
        try:
            yield plain_update
        except BaseException:  # as spinner: work that ended in an error did not finish, so no "done"
            plain.close(finished=False)  # line above the error's one line
            raise
        plain.close()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        _time_left_column(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total, phase_start=time.monotonic())
        _count_from_command_start(bar, task)

        def update(done: int, total: int | None = None) -> None:
            if total is None:
                bar.update(task, completed=done)
            else:
                bar.update(task, completed=done, total=total)

        def say(message: str) -> None:  # a stage after the counted work: the bar says what runs now
            bar.update(task, description=f"{label}: {message}")

        update.say = say
        yield update


def _time_left_column():
    """A rich column of the time left as PlainProgress says it (time_left): blank before ETA_AFTER of
    the work (rich's own extrapolated from the first items)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimeLeft(ProgressColumn):
        def render(self, task) -> Text:
            mine = time.monotonic() - task.fields["phase_start"]
            left = time_left(int(task.completed), int(task.total or 0), mine)
            if left is None:
                return Text("-:--:--", style="progress.remaining")
            minutes, seconds = divmod(round(left), 60)
            return Text(f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}", style="progress.remaining")

    return TimeLeft()


def _count_from_command_start(bar, task) -> None:
    """A rich bar's elapsed time from the command's start, not this phase's (rich's clock is monotonic)."""
    started = bar._tasks[task].start_time
    if started is not None:
        bar._tasks[task].start_time = started - (time.monotonic() - command_elapsed_origin())


@contextmanager
def spinner(description: str, disabled: bool = False):
    """A one-line live status for long work of unknown length; yields ``progress(message)``. Off a
    terminal: each new stage, and the current one every few seconds, as a plain line on stderr."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not disabled:
        _progress_shown.set()
    if not disabled and not console.is_terminal:
        plain = PlainProgress(description)
        try:
            yield plain.say
        except BaseException:  # an error or Ctrl-C: the work did not finish, so no "done" line
            plain.close(finished=False)
            raise
        plain.close()
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=disabled,
    ) as bar:
        task = bar.add_task(description, total=None)
        _count_from_command_start(bar, task)
        yield lambda message: bar.update(task, description=str(message)[:70])
