"""The zone types of ``limits:`` are records the engines look up, not names they branch on.

A type is its module's ``ZONE_TYPE`` (gateway/limits/algo.py), found by gateway/limits/registry.py;
its Lua script joins request.lua's and undo.lua's dispatch through ``--#algos``. The last test
plays the next type: a record the tree has never seen, registered at run time, decided by the
embedded store, carried across the shared store's wire, shown by the inspect reader and turned
into request.lua's arguments, with no other file knowing its name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.config.zones import ALGO_TYPES, ZONE_KEYS, ZoneSpec
from gateway.http.keys import parse_key
from gateway.limits import registry
from gateway.limits.algo import AlgoType
from gateway.limits.outcome import AlgoOutcome
from gateway.limits.params import AlgoParams, RouteLimits
from gateway.logs.access import JSON_FIELDS
from gateway.logs.formats import VARIABLES
from gateway.store import lua
from gateway.store.inspect import describe
from gateway.store.memory import MemoryStore
from gateway.store.redis.reply import algo_params
from gateway.store.shared import _limits
from gateway.store.shared import describe as describe_route

ROOT = Path(__file__).resolve().parents[3]
# where a zone type's name must not appear as a string: the engines look the record up
ENGINES = ("store", "plan", "pipeline", "logs", "http", "metrics")


def test_the_registry_holds_the_schema_types():
    assert set(registry.algo_types()) == set(ALGO_TYPES)
    assert set(ALGO_TYPES) <= set(ZONE_KEYS)
    assert list(registry.algo_types()) == sorted(registry.algo_types())


def test_each_script_has_the_interface_and_the_dispatch_lists_it():
    batch, undo = lua.source("batch.lua"), lua.source("undo.lua")
    for t in registry.algo_types().values():
        text = lua.read(t.script)
        assert f"local function {t.name}_algo_peek(" in text and f"local function {t.name}_algo_commit(" in text
        assert text.index(f"{t.name}_algo_peek") < text.index(lua.ENTRY)  # the standalone entry is unchanged
        assert f"[{t.code}] = {{peek = {t.name}_algo_peek, commit = {t.name}_algo_commit}}" in batch
        if t.undo_tag:
            assert f"local function {t.name}_algo_undo(" in text
            assert f"{t.undo_tag} = {t.name}_algo_undo" in undo


def test_each_type_has_its_status_variable():
    for name in registry.algo_types():
        assert f"limit_{name}_status" in VARIABLES and f"limit_{name}_status" in JSON_FIELDS


def test_no_engine_branches_on_a_type_name():
    names = set(registry.algo_types())
    found = []
    for package in ENGINES:
        for path in sorted((ROOT / "gateway" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


# -- the next type -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaParams:
    limit: int


def _decide(p: QuotaParams, state: Any, now: int, cost: int) -> tuple[AlgoOutcome, Any]:
    used = (state or 0) + cost
    if used > p.limit:
        return AlgoOutcome(False, p.limit, 0, 1, 1), None
    return AlgoOutcome(True, p.limit, p.limit - used, -1, 1), used


QUOTA = AlgoType(
    name="quota",
    code=99,
    script="quota.lua",
    params=QuotaParams,
    params_of=lambda zone: QuotaParams(zone.limit),
    decide=_decide,
    expired=lambda p, state, now: False,
    policy=lambda zone, p: f'"{zone}";q={p.limit}',
    lua_args=lambda p: [p.limit, 0, 0],
    undo=lambda p, cost, now, fields: "n",
    view=lambda p, state, now: {"used": state, "remaining": p.limit - state},
)


@pytest.fixture
def with_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    types = {**registry.algo_types(), "quota": QUOTA}
    monkeypatch.setattr(registry, "algo_types", lambda: types)


def test_a_new_type_needs_no_engine_change(with_quota: None):
    store = MemoryStore(clock_ms=lambda: 1_000)
    spec = ZoneSpec(name="q", type="quota", key=parse_key("$arg_k"), limit=2)  # type: ignore[arg-type]
    store.configure({"q": spec})
    route = RouteLimits((), (), (), False, (AlgoParams("q", "quota", QuotaParams(2)),))
    answers = [store.decide(route, [], [], [], [(b"k", 1)]).algo[0] for _ in range(3)]
    assert [(a.allowed, a.remaining) for a in answers if a is not None] == [(True, 1), (True, 0), (False, 0)]
    table = store.zones["q"]
    assert describe(table, table.lookup(b"k"), 1_000) == {"used": 2, "remaining": 0}
    assert store.status()["zones"]["q"]["type"] == "quota"
    assert _limits(describe_route(route)) == route  # the shared store's wire
    assert algo_params(route.limit_algo[0]) == [99, 2, 0, 0]  # request.lua's arguments
