"""Budgets (engine/budget.py): how ``--budget`` is written and read."""

from __future__ import annotations

import pytest

from engine.budget import MARKS, UNBOUNDED_EPOCHS, Budget, epochs_to_run, parse_budget
from engine.errors import ConfigError
from engine.plan import build_config


@pytest.mark.parametrize(("text", "budget"), [
    ("300s", Budget(300.0, "s")), ("2.5s", Budget(2.5, "s")),
    (" 60000samples", Budget(60000, "samples")),
    ("2000UPDATES", Budget(2000, "updates")), ("1e3updates", Budget(1000, "updates")),
])
def test_forms_that_parse_and_read_back(text: str, budget: Budget) -> None:
    assert parse_budget(text) == budget
    assert parse_budget(budget.text) == budget


@pytest.mark.parametrize("text", ["300", "s", "-5s", "0s", "1.5samples", "5 minutes", "1e13s"])
def test_forms_that_say_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match="budget"):
        parse_budget(text)


def test_marks_are_the_quarters_before_the_end() -> None:
    assert MARKS == (0.25, 0.5, 0.75)
    assert Budget(60.0, "s").marks() == (15.0, 30.0, 45.0)


def test_a_budget_replaces_the_epochs() -> None:
    assert epochs_to_run(7, None) == 7
    assert epochs_to_run(7, "60s") == UNBOUNDED_EPOCHS


def test_the_config_stores_the_canonical_budget_and_refuses_a_bad_one() -> None:
    config = build_config({}, {"data.dataset": "digits", "stop.budget": "60.0s"})
    assert config.stop.budget == "60s"
    with pytest.raises(ConfigError, match="SECONDSs, Nsamples or Nupdates"):
        build_config({}, {"data.dataset": "digits", "stop.budget": "sixty"})
    with pytest.raises(ConfigError, match="stop.budget"):
        build_config({}, {"data.dataset": "digits", "optimizer.name": "lbfgs",
                          "stop.budget": "60s"})
