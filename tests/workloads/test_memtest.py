"""The GPU memory test's code on a CPU buffer: clean memory passes, a planted bad word is caught in
every pattern and located (offset, address, what was written and read)."""

from __future__ import annotations

import pytest
import torch

from workloads.gpu import memtest

MiB = 1 << 20
SMALL = memtest.Config(total_bytes=4 * MiB, chunk_bytes=1 * MiB)


def test_clean_memory_passes_every_pattern() -> None:
    result = memtest.run(SMALL)
    assert result.metric("memtest_errors").value == 0 and result.metric("memtest_coverage").value == 1.0
    assert result.details["passes"] == 35 and result.details["tested_gib"] == pytest.approx(4 / 1024, abs=1e-3)


@pytest.mark.parametrize("pattern", ["walking_ones", "random", "address"])
def test_planted_bad_word_is_caught_and_located(pattern: str) -> None:
    planted: list[str] = []

    def flip(p: memtest.Pass, chunks: list[torch.Tensor]) -> None:
        if p.pattern == pattern and not planted:  # once: one word of chunk 2 loses bit 9 after the write
            chunks[2][1234] ^= 1 << 9
            planted.append(p.label)

    result = memtest.run(SMALL, after_write=flip)
    assert result.metric("memtest_errors").value == 1
    [bad] = result.details["bad_words"]
    assert bad["pattern"] == planted[0] and bad["offset"] == 2 * MiB + 1234 * 4
    assert int(bad["expected"], 16) ^ int(bad["read"], 16) == 1 << 9
    assert result.details["first_bad"][0].endswith("bits [9]")
    assert result.details["errors_by_pass"] == {planted[0]: 1}


def test_address_pattern_holds_each_words_own_index() -> None:
    out = torch.empty(8, dtype=torch.int32)
    memtest.write(memtest.Pass("address", 0), out, base_word=3 << 30, seed=0)
    assert [v & 0xFFFFFFFF for v in out.tolist()] == [(3 << 30) + i for i in range(8)]
    memtest.write(memtest.Pass("address", 1), out, base_word=3 << 30, seed=0)
    assert [v & 0xFFFFFFFF for v in out.tolist()] == [~((3 << 30) + i) & 0xFFFFFFFF for i in range(8)]


def test_a_chunk_full_of_errors_is_counted_whole_and_reported_briefly() -> None:
    chunk = torch.zeros(1 << 18, dtype=torch.int32)
    count, found = memtest.check(chunk, memtest.Pass("walking_ones", 4), 0, 0, torch.empty_like(chunk), limit=3)
    assert count == 1 << 18 and [b.offset for b in found] == [0, 4, 8]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"chunk_bytes": 3 * MiB}, "power of two"), ({"fraction": 1.5}, "between 0 and 1"),
    ({"patterns": ("checkerboard",)}, "unknown"),
])
def test_bad_config_is_refused(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        memtest.Config(**kwargs)
