"""The CLI imports its commands, never the reverse (the cli <-> commands.eval cycle stays closed)."""

from __future__ import annotations

import grimp
import pytest

import kvgate.cli
import kvgate.commands.exit_codes as exit_codes


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kvgate")


def test_no_command_imports_the_cli(graph: grimp.ImportGraph) -> None:
    chain = graph.find_shortest_chain(
        importer="kvgate.commands", imported="kvgate.cli", as_packages=True
    )
    assert chain is None, " -> ".join(chain or ())


def test_the_cli_imports_the_commands_exit_codes(graph: grimp.ImportGraph) -> None:
    assert "kvgate.commands.exit_codes" in graph.find_modules_directly_imported_by("kvgate.cli")


def test_the_cli_exit_codes_are_the_commands_ones() -> None:
    # kvgate.cli keeps its names (tests and docs use kvgate.cli.EXIT_BUG); one value each
    names = ["EXIT_OK", "EXIT_GATE_FAILED", "EXIT_INPUT", "EXIT_INCONCLUSIVE", "EXIT_EXTERNAL"]
    names.append("EXIT_BUG")
    assert [getattr(kvgate.cli, n) for n in names] == [0, 1, 2, 3, 4, 70]
    assert [getattr(exit_codes, n) for n in names] == [0, 1, 2, 3, 4, 70]
