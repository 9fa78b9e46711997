"""A teacher's capacity sweep from the engine panel, without Chainlit.

The same sweep as `python -m bench sweep` (`core.load.sweep`), on the session's
backend, with bounds that finish in a few minutes on a 2-core CPU: 1, 2, 4, 8
and 16 people, 8 requests per level (at least one per person), no request sent
after 60 s of a level, 64 new tokens, the English prompt set, stopping at
saturation. The objective comes from `CAPACITY_SLO` and `CAPACITY_PERCENTILE`
(default ttft_ms=500,tpot_ms=50 for 90% of replies), and the classroom load
test reports the share of replies meeting the same one.

`TeacherSweep` holds a running sweep's live state (what the panel's chart
draws as the load grows), then its plain answer in both languages, and the
row the database keeps (`store.StoredSweep`), listed in the panel for later.
"""

from __future__ import annotations

import os
import statistics
import uuid
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

from backends.registry import Registry
from config import ConfigurationError
from core.load.prompt_sets import BenchPrompt
from core.load.runner import LiveCounters
from core.load.slo import DEFAULT_PERCENTILE, DEFAULT_SLO, Slo, SloError, parse_slo
from core.load.sweep import LevelFigures, SweepRun, SweepSettings, capacity, run_sweep
from core.load.sweep_report import LANGS, plain_answer, slo_phrase, summary_json
from store import StoredSweep
from store.records import utc_now

APP_LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0)
APP_REQUESTS = 8
APP_MAX_SECONDS = 60.0
APP_MAX_NEW_TOKENS = 64
APP_PROMPTS = "en"
LISTED_SWEEPS = 10


def slo_from_env(env: Mapping[str, str] | None = None) -> Slo:
    """The objective of the app's sweeps and of the classroom load test's summary.
    Raises ConfigurationError naming the variable."""
    env = os.environ if env is None else env
    raw_percentile = env.get("CAPACITY_PERCENTILE") or str(DEFAULT_PERCENTILE)
    try:
        percentile = float(raw_percentile)
    except ValueError:
        raise ConfigurationError(f"CAPACITY_PERCENTILE={raw_percentile!r} is not a number.") from None
    try:
        return parse_slo(env.get("CAPACITY_SLO") or DEFAULT_SLO, percentile=percentile)
    except SloError as error:
        raise ConfigurationError(f"CAPACITY_SLO / CAPACITY_PERCENTILE: {error}.") from None


def app_sweep_settings(env: Mapping[str, str] | None = None) -> SweepSettings:
    return SweepSettings(mode="concurrency", levels=APP_LEVELS, slo=slo_from_env(env), requests=APP_REQUESTS,
                         max_seconds=APP_MAX_SECONDS, max_new_tokens=APP_MAX_NEW_TOKENS, warmup=1,
                         prompt_set=APP_PROMPTS)


@dataclass
class TeacherSweep:
    """One sweep started from the engine panel: on which backend, by whom, and how far it got."""

    backend: str  # the configured name
    label: str  # as shown (a stand-in says so)
    settings: SweepSettings
    user: str | None = None
    hardware: str = ""
    live: LiveCounters = field(default_factory=LiveCounters)
    levels: list[LevelFigures] = field(default_factory=list)
    current_level: float | None = None
    run: SweepRun | None = None
    problem: str | None = None  # why it measured nothing (the backend is down, ...)

    @property
    def done(self) -> bool:
        return self.run is not None or self.problem is not None

    def _on_level(self, _engine, figures: LevelFigures) -> None:
        self.levels.append(figures)
        following = [level for level in self.settings.levels if level > figures.level]
        self.current_level = following[0] if following and not figures.saturation else None

    async def execute(self, registry: Registry, prompts: Sequence[BenchPrompt], hardware: str) -> SweepRun:
        """Run the sweep (cancelled: keeps what was measured, marked interrupted)."""
        self.hardware = hardware
        self.current_level = self.settings.levels[0]
        try:
            self.run = await run_sweep(registry, [self.backend], prompts, self.settings, hardware,
                                       on_level=self._on_level, live=self.live)
        finally:
            self.current_level = None
        if not self.run.engines:
            self.problem = self.run.skipped.get(self.backend, "it could not be measured")
        return self.run

    def answer(self, lang: str) -> str | None:
        """The plain answer in `lang` (None until a level was measured)."""
        if self.run is None or not self.run.engines:
            return None
        found = capacity(self.settings.mode, self.run.engines[0])
        return None if found is None else plain_answer(self.label, self.settings.mode, found, self.settings.slo,
                                                       self.hardware, lang)

    def stored(self) -> StoredSweep | None:
        """The row the database keeps (None when nothing was measured)."""
        if self.run is None or not self.run.engines:
            return None
        engine = self.run.engines[0]
        settings = asdict(self.settings) | {"slo": self.settings.slo.as_dict()}
        return StoredSweep(
            id=str(uuid.uuid4()), created_at=utc_now(), user_identifier=self.user, backend=self.backend,
            backend_label=self.label, model=engine.model, mode=self.settings.mode, hardware=self.hardware,
            settings=settings, answer_en=self.answer("en") or "", answer_zh=self.answer("zh") or "",
            summary=summary_json(self.run), interrupted=self.run.interrupted)

    def props(self, lang: str) -> dict:
        """What the engine panel draws: a point per measured level, the level running now, the answer."""
        ttfts = self.live.first_token_s
        running = None
        if self.current_level is not None and not self.done:
            running = {"level": self.current_level, "finished": self.live.finished,
                       "total": self.settings.requests_at(self.current_level), "inFlight": self.live.in_flight,
                       "medianTtftMs": None if not ttfts else round(statistics.median(ttfts) * 1000, 1)}
        return {
            "backend": self.label,
            "levels": list(self.settings.levels),
            "slo": slo_phrase(self.settings.slo, lang), "percentile": self.settings.slo.percentile,
            "points": [level_point(figures) for figures in self.levels],
            "running": running, "done": self.done,
            "answer": self.answer(lang) if self.done else None, "problem": self.problem,
        }


def level_point(figures: LevelFigures) -> dict:
    summary = figures.summary

    def rounded(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    return {"users": figures.level, "ttftP50": rounded(summary.ttft_ms.median), "ttftP90": rounded(summary.ttft_ms.p90),
            "tokensPerUser": rounded(figures.median_tokens_per_s_per_user),
            "tokensPerS": rounded(summary.output_throughput),
            "sloShare": None if figures.slo_share is None else round(figures.slo_share, 3),
            "saturation": figures.saturation}


def listed(sweeps: Sequence[StoredSweep], lang: str) -> list[dict]:
    """Earlier sweeps for the panel's list, newest first, in the person's language."""
    return [{"id": sweep.id, "at": f"{sweep.created_at:%Y-%m-%d %H:%M} UTC", "backend": sweep.backend_label,
             "answer": sweep.answer(lang if lang in LANGS else "en"), "interrupted": sweep.interrupted}
            for sweep in sweeps[:LISTED_SWEEPS]]
