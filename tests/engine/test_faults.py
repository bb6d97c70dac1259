"""``--fault`` specs (engine.faults) and their place in the run configuration (engine.config):
every accepted form, every refusal with its message, and the checks that need the whole config
(a kill must name a rank the cluster has; a drop does not mix with a pull filter; the simulator
models no faults)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from engine.config import FaultConfig
from engine.errors import ConfigError
from engine.faults import (
    MAX_DELAY_MS,
    MAX_DROP_PERCENT,
    Delay,
    Drop,
    FaultPlan,
    Kill,
    parse_fault,
)
from engine.plan import parse_config

FORMS = ("is not one of kill:worker:RANK@SECONDS, kill:server:RANK@SECONDS, "
         "kill:evaluator:0@SECONDS, drop:PERCENT% or delay:MSms (e.g. kill:worker:1@20s, "
         "drop:1%, delay:5ms)")


# -- parse_fault: accepted forms --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("kill:worker:1@20s", Kill("worker", 1, 20.0)),
        ("kill:server:0@2.5s", Kill("server", 0, 2.5)),
        ("kill:worker:12@0s", Kill("worker", 12, 0.0)),
        ("kill:server:3@7", Kill("server", 3, 7.0)),  # the trailing s is optional
        ("drop:1%", Drop(0.01)),
        ("drop:0.5%", Drop(0.005)),
        (f"drop:{MAX_DROP_PERCENT:g}%", Drop(0.5)),
        ("delay:5ms", Delay(0.005)),
        ("delay:0.5ms", Delay(0.0005)),
        (f"delay:{MAX_DELAY_MS:g}ms", Delay(10.0)),
    ],
)
def test_every_accepted_form_parses(text: str, fault: Kill | Drop | Delay) -> None:
    assert parse_fault(text) == fault


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("KILL:Worker:1@20S", Kill("worker", 1, 20.0)),
        ("  kill:server:0@2.5s\t", Kill("server", 0, 2.5)),
        ("\nDROP:1%  ", Drop(0.01)),
        (" Delay:5MS ", Delay(0.005)),
    ],
)
def test_case_and_surrounding_whitespace_do_not_matter(text: str,
                                                       fault: Kill | Drop | Delay) -> None:
    assert parse_fault(text) == fault


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("kill:worker:1@20s", "kill:worker:1@20s"),
        ("kill:server:0@2.5", "kill:server:0@2.5s"),
        ("KILL:WORKER:01@020.0S", "kill:worker:1@20s"),
        ("drop:1%", "drop:1%"),
        ("drop:0.5%", "drop:0.5%"),
        ("delay:5ms", "delay:5ms"),
        ("delay:12.5ms", "delay:12.5ms"),
    ],
)
def test_spec_is_the_canonical_text(text: str, spec: str) -> None:
    fault = parse_fault(text)
    assert fault.spec == spec
    assert parse_fault(fault.spec) == fault


# -- parse_fault: refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "kill",
        "kill:worker",
        "kill:worker:1",
        "kill:coordinator:0@5s",
        "kill:worker:-1@5s",
        "kill:worker:a@5s",
        "kill:worker:1@-5s",
        "kill:worker:1@5m",
        "kill: worker:1@5s",  # whitespace inside a spec is not stripped
        "drop:1",
        "drop:%",
        "drop:-1%",
        "drop: 1%",
        "delay:5",
        "delay:5s",
        "delay:5 ms",
        "delay:-5ms",
        "partition:1%",
        "drop:1%,delay:5ms",
    ],
)
def test_an_unknown_form_is_refused_naming_the_accepted_forms(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fault(text)
    assert str(caught.value) == f"fault {text!r} {FORMS}"


@pytest.mark.parametrize("text", ["drop:0%", "drop:0.0%", "drop:60%", "drop:50.01%", "drop:100%"])
def test_a_drop_rate_outside_0_to_50_percent_is_refused(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fault(text)
    assert str(caught.value) == f"fault {text!r}: a drop rate must be in (0, 50] %"


@pytest.mark.parametrize("text", ["delay:0ms", "delay:0.0ms", "delay:20000ms", "delay:10000.5ms"])
def test_a_delay_outside_0_to_10_seconds_is_refused(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fault(text)
    assert str(caught.value) == f"fault {text!r}: a delay must be in (0, 10000] ms"


def test_a_refusal_quotes_the_text_as_given() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fault("  DROP:0%  ")
    assert str(caught.value) == "fault '  DROP:0%  ': a drop rate must be in (0, 50] %"


# -- FaultPlan --------------------------------------------------------------------------------


def test_an_empty_plan_has_no_faults_and_is_not_lossy() -> None:
    plan = FaultPlan.of(())
    assert plan == FaultPlan()
    assert (plan.kills, plan.drop, plan.delay_s, plan.lossy) == ((), 0.0, 0.0, False)


def test_a_plan_collects_kills_in_time_order_and_one_drop_and_delay() -> None:
    plan = FaultPlan.of(["kill:worker:1@20s", "delay:5ms", "KILL:server:0@2.5s", "drop:1%",
                         "kill:worker:0@20s"])
    assert plan.kills == (Kill("server", 0, 2.5), Kill("worker", 1, 20.0),
                          Kill("worker", 0, 20.0))  # a stable sort: ties keep their order
    assert plan.drop == 0.01
    assert plan.delay_s == 0.005
    assert plan.lossy


def test_a_plan_accepts_a_tuple_or_a_list() -> None:
    assert FaultPlan.of(("drop:2%",)) == FaultPlan.of(["drop:2%"]) == FaultPlan((), 0.02, 0.0)


def test_kills_and_delays_alone_are_not_lossy() -> None:
    assert not FaultPlan.of(["kill:worker:0@1s", "delay:50ms"]).lossy
    assert FaultPlan.of(["drop:0.1%"]).lossy


@pytest.mark.parametrize(
    "specs",
    [
        ["drop:1%", "drop:2%"],
        ["drop:1%", "drop:1%"],
        ["delay:5ms", "delay:6ms"],
        ["drop:1%", "delay:5ms", "delay:5ms"],
    ],
)
def test_two_drops_or_two_delays_are_refused(specs: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        FaultPlan.of(specs)
    assert str(caught.value) == "give at most one drop:PERCENT% and one delay:MSms fault"


def test_a_plan_refuses_the_first_bad_spec() -> None:
    with pytest.raises(ConfigError, match=r"^fault 'drop:60%': a drop rate"):
        FaultPlan.of(["kill:worker:0@1s", "drop:60%", "nonsense"])


# -- FaultConfig and RunConfig ----------------------------------------------------------------


def config(**sections: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {"cluster": {"workers": 2, "servers": 2}}
    for name, section in sections.items():
        values[name] = {**values.get(name, {}), **section}
    return values


def test_fault_config_defaults() -> None:
    fault = FaultConfig()
    assert (fault.checkpoint_every_s, fault.max_restarts, fault.inject,
            fault.resend_after_s) == (None, 3, (), 0.1)


def test_fault_config_stores_the_specs_stripped_and_lower_case() -> None:
    run = parse_config(config(fault={"inject": [" KILL:Worker:1@20s ", "Drop:1%", "delay:5MS"]}))
    assert run.fault.inject == ("kill:worker:1@20s", "drop:1%", "delay:5ms")
    assert FaultPlan.of(run.fault.inject) == FaultPlan((Kill("worker", 1, 20.0),), 0.01, 0.005)


@pytest.mark.parametrize(
    ("inject", "message"),
    [
        (["drop:0%"], "fault 'drop:0%': a drop rate must be in (0, 50] %"),
        (["delay:20000ms"], "fault 'delay:20000ms': a delay must be in (0, 10000] ms"),
        (["drop:1%", "drop:2%"], "give at most one drop:PERCENT% and one delay:MSms fault"),
        (["explode"], f"fault 'explode' {FORMS}"),
    ],
)
def test_a_bad_inject_names_the_setting_and_the_problem(inject: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(fault={"inject": inject}))
    assert str(caught.value) == f"invalid configuration: fault.inject: {message}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kill:worker:2@20s",
         "fault kill:worker:2@20s: there is no worker 2 (cluster.workers = 2; ranks count from 0)"),
        ("kill:worker:9@1.5s",
         "fault kill:worker:9@1.5s: there is no worker 9 (cluster.workers = 2; ranks count "
         "from 0)"),
        ("kill:server:2@3s",
         "fault kill:server:2@3s: there is no server 2 (cluster.servers = 2; ranks count from 0)"),
    ],
)
def test_a_kill_of_a_rank_the_cluster_lacks_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(fault={"inject": [spec]}))
    assert str(caught.value) == f"invalid configuration: {message}"


def test_a_kill_of_the_last_rank_is_accepted() -> None:
    run = parse_config(config(cluster={"workers": 3, "servers": 1},
                              fault={"inject": ["kill:worker:2@1s", "kill:server:0@2s"]}))
    assert [k.spec for k in FaultPlan.of(run.fault.inject).kills] == ["kill:worker:2@1s",
                                                                      "kill:server:0@2s"]


def test_the_kill_check_follows_the_cluster_size() -> None:
    parse_config(config(cluster={"workers": 5}, fault={"inject": ["kill:worker:4@1s"]}))
    with pytest.raises(ConfigError, match=re.escape("there is no worker 4 (cluster.workers = 4;")):
        parse_config(config(cluster={"workers": 4}, fault={"inject": ["kill:worker:4@1s"]}))


@pytest.mark.parametrize(
    ("fault", "unmodelled"),
    [
        ({"inject": ["drop:1%"]}, "fault.inject"),
        ({"inject": ["kill:worker:0@1s"]}, "fault.inject"),
        ({"checkpoint_every_s": 5.0}, "fault.checkpoint_every_s"),
        ({"inject": ["delay:5ms"], "checkpoint_every_s": 1.0},
         "fault.inject, fault.checkpoint_every_s"),
    ],
)
def test_the_sim_backend_refuses_faults_and_checkpoints(fault: dict[str, Any],
                                                         unmodelled: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(cluster={"backend": "sim"}, fault=fault))
    assert str(caught.value) == (f"invalid configuration: cluster.backend sim does not model "
                                 f"{unmodelled}; run them on the local backend")


def test_the_sim_backend_accepts_the_other_fault_settings() -> None:
    run = parse_config(config(cluster={"backend": "sim"},
                              fault={"max_restarts": 0, "resend_after_s": 1.0}))
    assert run.fault.max_restarts == 0
    assert run.fault.inject == ()


def test_the_local_backend_accepts_faults_and_checkpoints() -> None:
    run = parse_config(config(fault={"inject": ["kill:server:1@2s", "drop:5%"],
                                     "checkpoint_every_s": 0.5}))
    assert run.fault.checkpoint_every_s == 0.5


DROP_AND_FILTER = ("invalid configuration: fault.inject drop and comm.pull_filter do not mix: "
                   "a filtered answer that is lost cannot be sent again as it was")


@pytest.mark.parametrize("pull_filter", ["significant:0", "significant:0.001"])
@pytest.mark.parametrize("inject", [["drop:1%"], ["kill:worker:0@1s", "DROP:0.5%", "delay:5ms"]])
def test_a_drop_with_a_pull_filter_is_refused(inject: list[str], pull_filter: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(comm={"pull_filter": pull_filter}, fault={"inject": inject}))
    assert str(caught.value) == DROP_AND_FILTER


@pytest.mark.parametrize(
    ("inject", "pull_filter"),
    [
        (["delay:5ms", "kill:worker:1@2s"], "significant:0.001"),  # nothing lost
        (["drop:1%"], "none"),
        ([], "significant:0"),
    ],
)
def test_a_drop_or_a_pull_filter_alone_is_accepted(inject: list[str], pull_filter: str) -> None:
    run = parse_config(config(comm={"pull_filter": pull_filter}, fault={"inject": inject}))
    assert (run.comm.pull_filter, run.fault.inject) == (pull_filter, tuple(inject))


@pytest.mark.parametrize(
    ("fault", "where"),
    [
        ({"checkpoint_every_s": 0}, "fault.checkpoint_every_s"),
        ({"resend_after_s": 0}, "fault.resend_after_s"),
        ({"resend_after_s": 61}, "fault.resend_after_s"),
        ({"max_restarts": -1}, "fault.max_restarts"),
        ({"inject": ["drop:1%"] * 65}, "fault.inject"),
        ({"surprise": 1}, "fault.surprise"),
    ],
)
def test_fault_settings_out_of_bounds_are_refused(fault: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError, match=rf"^invalid configuration: {re.escape(where)}: "):
        parse_config(config(fault=fault))


def test_the_config_round_trips_through_json_with_its_faults() -> None:
    run = parse_config(config(fault={"inject": ["Kill:Worker:1@20s", "drop:1%"],
                                     "checkpoint_every_s": 2.0, "max_restarts": 1}))
    again = parse_config(run.to_json_dict())
    assert again == run
    assert again.fault.inject == ("kill:worker:1@20s", "drop:1%")


def test_the_evaluator_can_be_killed_and_only_evaluator_0() -> None:
    from engine.plan import build_config

    assert parse_fault("kill:evaluator:0@3s") == Kill("evaluator", 0, 3.0)
    build_config({}, {"data.dataset": "digits", "fault.inject": ["kill:evaluator:0@3s"]})
    with pytest.raises(ConfigError, match="a run has one evaluator, evaluator 0"):
        build_config({}, {"data.dataset": "digits", "fault.inject": ["kill:evaluator:1@3s"]})
