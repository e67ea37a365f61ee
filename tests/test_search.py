"""How the search ranks the plans it has confirmed (``ckptplan.planning.search``): a compiled
plan by the time its partition is priced at, not by the chain's (Note [ranking compiled
plans])."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ckptplan.planning.search import Search

AIM = 100


@dataclass(frozen=True)
class ScriptedSearch(Search):
    """A search whose solver's plan for a target peaks 10 bytes above it, priced by
    ``prices``: target -> (the chain's recompute time, the partition's)."""

    prices: dict[int, tuple[float, float]] | None = None

    def _schedule(self, solver: str, target: int) -> Any:
        return target

    def _plan(self, schedule: Any) -> Any:
        chain, partition = (self.prices or {}).get(schedule, (9.0, 9.0))
        return SimpleNamespace(
            target=schedule, chain=chain, predicted=SimpleNamespace(recompute_time_s=partition)
        )

    def _confirmed(self, plan: Any) -> tuple[Any, int]:
        return plan, plan.target + 10

    def chain_time(self, plan: Any) -> float:
        return float(plan.chain)


def scripted(prices: dict[int, tuple[float, float]]) -> ScriptedSearch:
    unused: Any = None
    return ScriptedSearch(
        prof=unused,
        chain=unused,
        menus=None,
        workload=unused,
        options=unused,
        budget=SimpleNamespace(aim=AIM),
        offload=False,
        ranks=unused,
        baselines={},
        checked=True,
        prices=prices,
    )


def test_relaxing_keeps_the_plan_its_partition_prices_cheapest() -> None:
    """The target rises from 50 to 90 (both fit, at peaks 60 and 100). The chain prices the
    looser plan cheaper, the partition the first: the search keeps the first, which the
    compiled step runs faster when the partition's price is right."""
    search = scripted({50: (2.0, 1.0), 90: (1.0, 2.0)})
    first = search._plan(50)
    kept, peak = search._relaxed("auto", 50, first, 60)
    assert (kept.target, peak) == (50, 60)


def test_relaxing_takes_a_looser_plan_its_partition_prices_cheaper() -> None:
    search = scripted({50: (1.0, 2.0), 90: (2.0, 1.0)})
    kept, peak = search._relaxed("auto", 50, search._plan(50), 60)
    assert (kept.target, peak) == (90, 100)
