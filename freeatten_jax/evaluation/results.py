"""The suite's results, one schema: what `suite` measures, what `report`, `plots`, `paired` and `mqar_report` read,
and what results.json holds (`write` and `read` round-trip it).

A run's result is one checkpoint under one eval-time switch: text runs carry loss by length, retrieval cells and the
attention analysis; MQAR runs carry accuracy by length.
"""

import dataclasses
import gzip
import json
import pathlib

from freeatten_jax.errors import UserError
from freeatten_jax.evaluation.settings import Settings, compared
from freeatten_jax.training import storage


@dataclasses.dataclass
class LengthLoss:
    """Loss at one evaluation length over the held-out span, with 95% bootstrap intervals over windows."""

    length: int
    multiplier: int
    loss: float
    loss_ci: tuple[float, float]
    loss_last_train_len: float  # over the last training-length positions of each window
    loss_last_train_len_ci: tuple[float, float]
    per_window: list[float]  # for paired comparisons: every run scores the same windows
    windows: int
    tokens_scored: int


@dataclasses.dataclass
class RetrievalCell:
    """Greedy retrieval at one (prompt length, needle depth): None and `reason` where it could not be scored."""

    length: int
    depth: float
    accuracy: float | None = None
    mean_key_loglik: float | None = None
    mean_key_rank: float | None = None  # among the candidate keys, 1: the most likely
    keys: int = 0
    reason: str = ""


@dataclasses.dataclass
class RulerCell:
    """One RULER-style task at one length, per example: the fraction of references the greedy output contains, each
    reference's likelihood rank among the wrong answers (mean over references) and whether it ranked first (fraction),
    and the needle's depth where there is one needle; empty lists and `reason` where it could not be scored."""

    task: str
    length: int
    multiplier: int
    match: list[float] = dataclasses.field(default_factory=list)
    rank: list[float] = dataclasses.field(default_factory=list)
    top1: list[float] = dataclasses.field(default_factory=list)
    depth: list = dataclasses.field(default_factory=list)  # float, or None for several needles or none
    reason: str = ""


@dataclasses.dataclass
class AttentionStats:
    """Entropy and max weight [layers, H, U] by bucket of visible keys N_i >= n_from[u], at the longest length."""

    entropy: list
    max_weight: list
    n_from: list[int]


@dataclasses.dataclass
class MqarLength:
    """MQAR per-query accuracy at one length and placement of the pairs (data.mqar.PLACEMENTS); per_instance for
    paired statistics (the same pairs at every length), and every query's hit with what it asked [instance][slot]."""

    length: int
    multiplier: int
    queries: int
    accuracy: float
    per_instance: list[float]
    placement: str = "start"
    first_time_accuracy: float | None = None  # over queries for a key no earlier query asked for
    hits: list = dataclasses.field(default_factory=list)  # [B][P] 0/1
    repeated: list = dataclasses.field(default_factory=list)  # [B][P] 0/1: an earlier query asked for the same key
    distance: list = dataclasses.field(default_factory=list)  # [B][P] tokens from the query back to its pair


@dataclasses.dataclass
class RunResult:
    name: str  # the checkpoint's folder name (WORKDIR@STEP's with @STEP)
    workdir: str
    step: int
    variant: str  # as reports name it: a warm-started run's with its origin (`ssmax from softmax@450 +150`)
    switch: str  # the eval-time switch's label, "none" for the checkpoint as trained
    seed: int
    train_len: int
    rope_theta: float
    lengths: list[LengthLoss] = dataclasses.field(default_factory=list)  # text runs from here on
    span_tokens: int = 0
    per_position: list[float] = dataclasses.field(default_factory=list)  # at the longest length, mean over windows
    attention: AttentionStats | None = None
    passkey: list[RetrievalCell] = dataclasses.field(default_factory=list)
    retrieval: list[RetrievalCell] = dataclasses.field(default_factory=list)
    needle_mass: list = dataclasses.field(default_factory=list)  # [layers, H], mean over the longest prompts
    ssmax_s: list | None = None  # [layers, H] for SSMax runs
    ruler: list[RulerCell] = dataclasses.field(default_factory=list)  # the RULER-style tasks asked for
    mqar: list[MqarLength] | None = None  # MQAR runs only
    loss_unit: str = ""  # data.tokenizer.loss_unit of the run's tokenizer; "" in results files written before it

    @property
    def label(self) -> str:
        """How a run is named in tables and legends: checkpoint name, variant and switch."""
        return f"{self.name} ({self.variant})" + ("" if self.switch == "none" else f" [{self.switch}]")

    @property
    def group(self) -> tuple[str, str]:
        """Runs of one (variant, switch), e.g. seeds, form one group of the summary tables and plots."""
        return self.variant, self.switch

    def at(self, multiplier: int) -> LengthLoss:
        return next(x for x in self.lengths if x.multiplier == multiplier)


MIXED_UNITS = "nats per token; per byte for the byte tokenizer"  # runs of both kinds, or of results files before units


def loss_unit(runs: list[RunResult]) -> str:
    """The unit of the runs' losses, as reports state it: theirs when they share one, else MIXED_UNITS."""
    units = {r.loss_unit for r in runs}
    return units.pop() if len(units) == 1 and "" not in units else MIXED_UNITS


def write(path: pathlib.Path, runs: list[RunResult], settings: dict) -> None:
    """Writes results.json atomically: a kill leaves the earlier file or this one, never a torn one."""
    storage.write_atomic(path, json.dumps({"settings": settings, "runs": [dataclasses.asdict(r) for r in runs]}, indent=1))


def read(path) -> tuple[list[RunResult], dict]:
    """(runs, settings) of a results.json that `write` wrote, or of it gzipped (results.json.gz)."""
    path = pathlib.Path(path)
    saved = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    return [from_dict(r) for r in saved["runs"]], saved["settings"]


def check_alike(where: str, theirs: dict, ours: dict, keys: tuple[str, ...], remedy: str, kind: type) -> None:
    """Raises a UserError naming the first of the settings `keys` whose value differs between results measured under
    `theirs` and under `ours` (settings as results.json records them). A setting that `theirs` lacks did not exist when
    they were written: they count as measured under its default in `kind`."""
    defaults = {f.name: f.default for f in dataclasses.fields(kind)}
    for key in keys:
        theirs_is, ours_is = json.dumps(theirs.get(key, defaults.get(key))), json.dumps(ours[key])
        if theirs_is != ours_is:
            raise UserError(f"{where}: measured with {key}={theirs_is}, this evaluation with {ours_is}; {remedy}")


def earlier(paths: list[str], settings: dict, names: set[str], mqar: bool, kind: type = Settings) -> tuple[list[RunResult], dict]:
    """The runs of earlier results files, to report beside new ones without measuring them again, and the settings
    that then describe the report (`settings`: the new runs', fields of `kind`). Called before anything is measured:
    refuses a file measured under other settings, or holding a checkpoint named in `names` (measured again)."""
    runs, workdirs, switches = [], [], []
    for path in paths:
        try:
            theirs, their = read(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"--merge={path}: not a results file that freeatten-eval wrote ({e})") from None
        keys = compared(kind, mqar or any(r.mqar is not None for r in theirs))
        check_alike(f"--merge={path}", their, settings, keys, "only results measured alike are reported together", kind)
        if again := sorted(names & {r.name for r in theirs}):
            raise UserError(f"--merge={path}: holds {again[0]}, which is measured here too; leave out one")
        names = names | {r.name for r in theirs}
        runs += theirs
        workdirs += their["workdirs"]
        switches += their["switches"]
    described = {
        **settings,
        "workdirs": [*workdirs, *settings["workdirs"]],
        "switches": list(dict.fromkeys([*switches, *settings["switches"]])),
        "merged": [*map(str, paths)],
    }
    return runs, described


def length_loss(x: dict) -> LengthLoss:
    """The LengthLoss of its dict as JSON holds it (intervals as lists)."""
    return LengthLoss(**{k: tuple(v) if k.endswith("_ci") else v for k, v in x.items()})


def from_dict(r: dict) -> RunResult:
    return RunResult(
        **{
            **r,
            "lengths": [length_loss(x) for x in r.get("lengths", [])],
            "attention": AttentionStats(**r["attention"]) if r.get("attention") else None,
            "passkey": [RetrievalCell(**c) for c in r.get("passkey", [])],
            "retrieval": [RetrievalCell(**c) for c in r.get("retrieval", [])],
            "ruler": [RulerCell(**c) for c in r.get("ruler", [])],
            "mqar": None if r.get("mqar") is None else [MqarLength(**x) for x in r["mqar"]],
        }
    )
