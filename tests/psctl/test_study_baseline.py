"""``[study] baseline = { sync = "BSP" }``: each point's paired ratio is to the BSP point with
its own labels on every other axis, not to the grid's first point."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.errors import ConfigError
from psctl.study import load_study
from psctl.study_intervals import markdown, summary
from psctl.study_rows import Row


def _row(cluster: str, sync: str, seed: int, seconds: float) -> Row:
    return Row(labels={"cluster": cluster, "sync": sync}, seed=seed, run_id=f"{seed}",
               name=f"{cluster}-{sync}-{seed}", status="finished", time_to_target_s=seconds,
               final_accuracy=0.9, best_accuracy=0.9, iterations=1, epochs=None,
               idle_fraction=None, staleness_mean=None, bytes_per_sample=None, duration_s=10.0)


ROWS = [_row(c, s, seed, t * (1 + seed / 100))
        for c, s, t in (("calm", "BSP", 10.0), ("calm", "ASP", 5.0),
                        ("stormy", "BSP", 40.0), ("stormy", "ASP", 10.0))
        for seed in range(3)]


def test_each_point_is_paired_with_its_own_baseline() -> None:
    data = summary(ROWS, {"sync": "BSP"})
    ratios = {(p["labels"]["cluster"], p["labels"]["sync"]):
              p["versus_baseline"]["time_to_target_s"] for p in data["points"]}
    assert ratios[("calm", "BSP")] is None and ratios[("stormy", "BSP")] is None
    assert ratios[("calm", "ASP")]["ratio"] == pytest.approx(2.0)
    assert ratios[("stormy", "ASP")]["ratio"] == pytest.approx(4.0)  # not 10 / 10 = 1
    assert ratios[("stormy", "ASP")]["verdict"] == "faster"
    # without it, every point is compared to the grid's first (calm BSP)
    first = summary(ROWS)
    stormy = next(p for p in first["points"] if p["labels"] == {"cluster": "stormy",
                                                               "sync": "BSP"})
    assert stormy["versus_baseline"]["time_to_target_s"]["ratio"] == pytest.approx(0.25)
    text = "\n".join(markdown(ROWS, ["cluster", "sync"], {"sync": "BSP"}))
    assert "each point's sync BSP point" in text
    assert "| stormy | ASP | 4.00x" in text


@pytest.mark.parametrize(("baseline", "message"), [
    ('{ speed = "BSP" }', "baseline.speed: no axis of that name"),
    ('{ sync = "SSP" }', "baseline.sync: 'SSP' is none of the axis's values"),
])
def test_a_baseline_names_an_axis_and_one_of_its_values(tmp_path: Path, baseline: str,
                                                        message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f"""[study]
name = "s"
title = "s"
target = 0.5
repeat = 2
baseline = {baseline}

[[axis]]
name = "sync"
  [[axis.values]]
  label = "BSP"
  set = {{ "sync.model" = "bsp" }}
""")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_study(path)
