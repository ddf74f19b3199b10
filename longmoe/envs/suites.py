"""Named task suites: which environments, horizons and options a long-horizon evaluation plays.

``LONG`` is the long-horizon suite (issue 54): horizons 8, 16 and 32 in every environment, with
distractors and corrections (a later source superseding an earlier one, so reading order matters)
and tool results cut to a stated size. ``doclookup`` uses 2,000-character pages: its expert's
episode at horizon 32 is about 30K tokens (``bench/rollout_long.py`` measures it), 8K at horizon 8.
``suite_cells(name)`` gives ``(env, horizon) -> config fields`` for ``make_env``.
"""

from __future__ import annotations

from typing import Any

from longmoe.envs.base import EnvConfigError

LONG_HORIZONS = (8, 16, 32)
LONG: dict[str, dict[str, Any]] = {
    "doclookup": {"page_chars": 2000, "pages_per_doc": 2, "distractors": 16, "corrections": 2,
                  "max_result_chars": 2400},
    "calculator": {"distractors": 8, "corrections": 2},
    "sql": {"distractors": 16, "corrections": 2, "max_result_chars": 2000},
}  # fmt: skip
SUITES = {"long": LONG}


def suite_cells(
    name: str, envs: list[str] | None = None, horizons: list[int] | None = None
) -> dict[tuple[str, int], dict[str, Any]]:
    """``(env, horizon) -> config fields`` of suite ``name`` (optionally only ``envs`` / ``horizons``)."""
    if name not in SUITES:
        raise EnvConfigError(f"suite {name!r} is unknown: expected one of {sorted(SUITES)}")
    suite = SUITES[name]
    bad = sorted(set(envs or []) - set(suite))
    if bad:
        raise EnvConfigError(f"suite {name!r} has no environment(s) {bad}: expected some of {sorted(suite)}")
    return {
        (e, h): {**suite[e], "horizon": h}
        for e in (envs or list(suite))
        for h in (horizons or list(LONG_HORIZONS))
    }
