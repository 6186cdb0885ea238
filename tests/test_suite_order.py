"""The suite's collection order (tests/conftest.py): the slowest files first, every file kept whole and in order."""

from __future__ import annotations

from pathlib import Path

from tests import conftest as C


def test_every_named_slow_file_exists() -> None:
    missing = [f for f in C.SLOW_FIRST if not (C.TESTS / f).is_file()]
    assert not missing, f"tests/conftest.py SLOW_FIRST names files that are gone: {missing}"


def test_slow_files_sort_first_in_their_listed_order_and_the_rest_keep_theirs() -> None:
    paths = [C.TESTS / "test_stats.py", C.TESTS / C.SLOW_FIRST[2], C.TESTS / "rewards/test_contract.py",
             C.TESTS / C.SLOW_FIRST[0], Path("/elsewhere/test_x.py")]
    ordered = sorted(paths, key=C.slow_first_key)
    assert ordered == [paths[3], paths[1], paths[0], paths[2], paths[4]]


def test_the_collected_session_starts_with_the_slowest_file(request) -> None:  # noqa: ANN001
    items = request.session.items
    ranks = [C.slow_first_key(i.path) for i in items]
    assert ranks == sorted(ranks)  # the hook ran on this very session


def test_make_test_hands_out_files_in_collection_order() -> None:
    """xdist reorders files by their number of tests unless told not to: the slow files, which hold few tests,
    would then start last and run alone at the end of the suite."""
    make = (C.TESTS.parent / "Makefile").read_text()
    command = next(line for line in make.splitlines() if "-m pytest" in line)
    assert "--dist loadfile" in command and "--no-loadscope-reorder" in command, command
