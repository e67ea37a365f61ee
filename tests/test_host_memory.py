"""Timing on the CPU keeps freed memory in the process: a step reuses its pages instead of
faulting in fresh ones, which would charge the plan for the host allocator's work."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

STEPS = """
import resource, sys, torch
from ckptplan.profiling.memtrack import keep_freed_host_memory
if sys.argv[1] == "keep":
    keep_freed_host_memory()
def faults(elements):
    for _ in range(8):  # the heap grows over the first few (posix_memalign's alignment)
        torch.ones(elements)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        torch.ones(elements)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults(16 * 2**20))  # 64 MiB, above the largest threshold glibc lets a caller set
"""


def faults_of_four_steps(mode: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True
    )
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")
def test_a_freed_block_of_any_size_comes_back_without_page_faults() -> None:
    pages = 4 * 64 * 2**20 // 4096
    assert faults_of_four_steps("default") > pages // 2  # glibc maps and unmaps the block
    assert faults_of_four_steps("keep") < pages // 20
