"""Data analysis over seeded tables: chains of SQL queries whose results feed each other.

A task's database (generated on the spot as CSV text, loaded into ``envs.sql_sandbox``) has three
tables: ``stores(store_id, city, partner_city)``, ``orders(order_id, store_id, product, qty,
price)`` and ``voids(order_id, reason)``: orders cancelled after the fact, a later source that
corrects the orders table. A city's **leading store** is the one with the highest revenue (sum of
``qty * price`` over its orders, voided orders excluded). The question names a start city; the agent
goes to the leading store's ``partner_city`` and repeats until it reaches a city whose leading store
has no partner (``partner_city`` is ``NULL``), and answers **by how much that store's revenue
exceeds the runner-up's in the same city**. Each hop is filter (the city) -> aggregate (revenue per
store, voids removed) -> look up (the leader's partner) -> compare (only at the end): one query the
expert writes per hop, each needing the previous result, so ``horizon`` is the number of hops.

Distractor cities (``distractors``) hang off the non-leading stores' partners, so a wrong leader
leads astray; with ``corrections`` > 0 that many chain cities have voided orders that make a
non-leader the raw-revenue leader (ignoring ``voids`` picks the wrong store there).

The tool ``sql(query)`` runs one read-only statement in the sandbox and returns CSV, cut to
``max_rows`` rows and ``max_result_chars`` characters (both stated when they cut). The knowledge
state is how many hops, from the first, the agent has seen the correct leader of in a result (its
``store_id`` on the same row as its right revenue).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs.sql_sandbox import Sandbox, SandboxLimits, SQLError
from longmoe.envs.toolenv import ToolEnv, ToolError, check_range, function_schema
from longmoe.tasks.base import distinct, key_name

MAX_HORIZON = 32
_PRODUCTS = ("lamp", "kettle", "rope", "lantern", "barrel", "ladder", "basket", "anvil", "saddle", "quill")
EXPERT_SQL = (
    "SELECT s.store_id, s.partner_city, SUM(o.qty * o.price) AS revenue FROM stores s "
    "JOIN orders o ON o.store_id = s.store_id WHERE s.city = '{city}' "
    "AND o.order_id NOT IN (SELECT order_id FROM voids) "
    "GROUP BY s.store_id ORDER BY revenue DESC LIMIT 2"
)


@dataclass(frozen=True)
class SQLConfig:
    """``horizon``: cities to follow (one query each), 1..32; ``stores_per_city``: 2..8;
    ``orders_per_store``: 1..50; ``distractors``: cities off the chain (0..256); ``corrections``:
    chain cities whose raw leader is voided away (0..horizon); ``max_rows`` / ``max_result_chars``:
    result caps (1..1000 / 200..100000); ``max_turns``: 0 for ``2 * horizon + 4``."""

    horizon: int = 2
    stores_per_city: int = 3
    orders_per_store: int = 4
    distractors: int = 4
    corrections: int = 0
    max_rows: int = 20
    max_result_chars: int = 2000
    max_turns: int = 0

    def __post_init__(self) -> None:
        check_range("horizon", self.horizon, 1, MAX_HORIZON)
        check_range("stores_per_city", self.stores_per_city, 2, 8)
        check_range("orders_per_store", self.orders_per_store, 1, 50)
        check_range("distractors", self.distractors, 0, 256)
        check_range("corrections", self.corrections, 0, self.horizon)
        check_range("max_rows", self.max_rows, 1, 1000)
        check_range("max_result_chars", self.max_result_chars, 200, 100_000)
        check_range("max_turns", self.max_turns, 0, 10_000)


def _csv(header: str, rows: list[tuple]) -> str:
    return header + "\n" + "\n".join(",".join("" if v is None else str(v) for v in r) for r in rows)


class SQLEnv(ToolEnv):
    """Follow leading stores from city to city with read-only SQL; answer a revenue gap."""

    name = "sql"
    tools = [
        function_schema(
            "sql",
            "Run one read-only SQL query (SQLite) on the task's tables; returns the result as CSV.",
            {"query": ("string", "a single SELECT statement")},
        )
    ]
    instructions = (
        "You analyse a database with SQL. A city's leading store is the store with the highest "
        "revenue, the sum of qty * price over its orders; orders listed in the voids table were "
        "cancelled and do not count. Use the sql tool; when you know the answer, reply with the "
        "number only."
    )

    def __init__(self, config: SQLConfig | None = None) -> None:
        self.config = config or SQLConfig()
        c = self.config
        super().__init__(c.horizon, c.max_turns or 2 * c.horizon + 4)
        self.limits = SandboxLimits(max_rows=c.max_rows, max_chars=c.max_result_chars)
        self.box: Sandbox | None = None

    def _draw(self, seed: int) -> str:
        c = self.config
        rng = random.Random(
            f"longmoe-env:sql:{c.horizon}:{c.stores_per_city}:{c.orders_per_store}:{c.distractors}:"
            f"{c.corrections}:{seed}"
        )
        n_cities = c.horizon + c.distractors
        cities = distinct(rng, n_cities, key_name)
        chain, others = cities[: c.horizon], cities[c.horizon :]
        store_ids = [f"S{i}" for i in rng.sample(range(1000, 10_000), n_cities * c.stores_per_city)]
        corrected = set(rng.sample(range(c.horizon), c.corrections))
        stores, orders, voids = [], [], []
        oid = iter(
            rng.sample(range(10_000, 1_000_000), n_cities * c.stores_per_city * c.orders_per_store + 64)
        )
        self.leaders: list[tuple[str, int]] = []  # per chain city: (leader id, its revenue)
        for ci, city in enumerate(cities):
            ids = store_ids[ci * c.stores_per_city : (ci + 1) * c.stores_per_city]
            # distinct revenues: the leader's is unique, so the answer (leader - runner-up) is exact
            revenues = sorted(rng.sample(range(50, 5000), c.stores_per_city), reverse=True)
            for k, (sid, rev) in enumerate(zip(ids, revenues, strict=True)):
                if ci < c.horizon and k == 0:
                    partner = chain[ci + 1] if ci + 1 < c.horizon else None
                else:  # other stores point into the distractors (or nowhere)
                    partner = rng.choice(others) if others and rng.random() < 0.8 else None
                stores.append((sid, city, partner))
                for qty, price in _split(rng, rev, c.orders_per_store):
                    orders.append((next(oid), sid, rng.choice(_PRODUCTS), qty, price))
                if ci in corrected and k == 1:  # a voided order lifts the runner-up over the leader
                    extra = revenues[0] - rev + rng.randint(10, 500)
                    o = next(oid)
                    orders.append((o, sid, rng.choice(_PRODUCTS), extra, 1))
                    voids.append((o, "cancelled"))
            if ci < c.horizon:
                self.leaders.append((ids[0], revenues[0]))
                self.gap = revenues[0] - revenues[1]  # the last chain city's is the answer
        rng.shuffle(stores)
        rng.shuffle(orders)
        voids.append((next(oid), "duplicate"))  # a void of no existing order: harmless noise
        rng.shuffle(voids)
        tables = {
            "stores": _csv("store_id,city,partner_city", stores),
            "orders": _csv("order_id,store_id,product,qty,price", orders),
            "voids": _csv("order_id,reason", voids),
        }
        if self.box is not None:
            self.box.close()
        self.box = Sandbox(tables, self.limits)
        self.chain = chain
        self.seen: set[tuple[str, int]] = set()  # (store id, revenue) pairs seen on one result row
        return (
            f"Tables:\n{self.box.describe()}\n\nStart in the city {chain[0]}. Find its leading store "
            "and go to that store's partner_city; repeat until you reach a city whose leading store "
            "has no partner (partner_city is NULL). By how much does that leading store's revenue "
            "exceed the revenue of the second-highest store in the same city? Reply with the number only."
        )

    @property
    def answer(self) -> str:
        return str(self.gap)

    def _run(self, name: str, arguments: dict[str, Any]) -> str:
        assert self.box is not None
        try:
            text = self.box.query(arguments["query"])
        except SQLError as e:
            raise ToolError(str(e)) from None
        for line in text.split("\n")[1:]:
            cells = line.split(",")
            for sid, rev in self.leaders:
                if sid in cells and str(rev) in cells:
                    self.seen.add((sid, rev))
        return text

    def progress(self) -> int:
        """Hops, from the first, whose leader the agent has seen with its right revenue."""
        k = 0
        while k < self.horizon and self.leaders[k] in self.seen:
            k += 1
        return k

    def state_key(self) -> str:
        return f"sql:{self.seed}:{self.progress()}"

    def expert(self) -> AssistantTurn:
        k = self.progress()
        if k == self.horizon:
            return AssistantTurn(self.answer)
        return AssistantTurn("", (ToolCall("sql", {"query": EXPERT_SQL.format(city=self.chain[k])}),))


def _split(rng: random.Random, total: int, n: int) -> list[tuple[int, int]]:
    """``n`` (qty, price) pairs whose ``qty * price`` sum to ``total`` (price 1 pads the rest)."""
    out, left = [], total
    for _ in range(n - 1):
        price = rng.randint(2, 20)
        qty = rng.randint(0, max(0, left // (price * n)))
        out.append((qty, price))
        left -= qty * price
    out.append((left, 1))
    return out
