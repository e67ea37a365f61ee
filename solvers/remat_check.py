"""Independent checker for rematerialization schedules, written from the README's definition.

It shares no code with the solver (only the problem's data class), so a bug in the solver's own
memory accounting cannot hide behind the same bug here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptplan.solvers.remat import RematProblem

__all__ = ["check_schedule"]


def check_schedule(problem: RematProblem, order: Sequence[int], budget: int) -> tuple[int, int]:
    """``(cost, peak)`` of the schedule ``order``; ``ValueError`` saying why if it is invalid.

    Valid means: every node appears, every appearance comes after some appearance of each of its
    inputs (it reads the most recent copy), and the peak memory is at most ``budget``. The copy
    made at step ``i`` is resident from ``i`` through the last step that reads that copy (only
    step ``i`` when nothing reads it); memory at a step is the sum of sizes of resident copies.

    >>> from ckptplan.solvers.remat import RematNode, RematProblem
    >>> p = RematProblem(tuple(RematNode(i, cost=1, mem=2) for i in range(3)), ((0, 1), (1, 2)))
    >>> check_schedule(p, [0, 1, 2], budget=4)
    (3, 4)
    >>> check_schedule(p, [0, 2, 1], budget=4)
    Traceback (most recent call last):
    ...
    ValueError: step 1 runs node 2 before its input 1 has run
    """
    size = {node.id: node.mem for node in problem.nodes}
    price = {node.id: node.cost for node in problem.nodes}
    inputs: dict[int, list[int]] = {node.id: [] for node in problem.nodes}
    for source, target in problem.edges:
        if source not in inputs[target]:
            inputs[target].append(source)

    copy_of: dict[int, int] = {}  # node -> step that made its most recent copy
    end_of_copy: dict[int, int] = {}  # step that made a copy -> last step reading it
    for step, node in enumerate(order):
        if node not in size:
            raise ValueError(f"step {step} runs {node!r}, which is not a node of the problem")
        for source in inputs[node]:
            if source not in copy_of:
                raise ValueError(f"step {step} runs node {node} before its input {source} has run")
            end_of_copy[copy_of[source]] = step
        copy_of[node] = step
        end_of_copy[step] = step

    never_run = [node.id for node in problem.nodes if node.id not in copy_of]
    if never_run:
        shown = ", ".join(str(v) for v in never_run[:5])
        more = f" and {len(never_run) - 5} more" if len(never_run) > 5 else ""
        raise ValueError(f"node {shown}{more} never runs")

    events: list[tuple[int, int]] = []
    for start, end in end_of_copy.items():
        events.append((start, size[order[start]]))
        events.append((end + 1, -size[order[start]]))
    events.sort()
    peak, peak_step, current = 0, 0, 0
    for i, (step, change) in enumerate(events):
        current += change
        last_at_step = i + 1 == len(events) or events[i + 1][0] != step
        if last_at_step and current > peak:
            peak, peak_step = current, step
    if peak > budget:
        raise ValueError(f"memory {peak} at step {peak_step} exceeds the budget {budget}")
    return sum(price[node] for node in order), peak
