"""The attention stack's import layout: functional ← kernels ← attention, and no cycles.

The import graph comes from grimp (the graph library behind import-linter); it includes imports
made inside functions, which is where cycles usually hide.
"""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

#: Lowest layer first; a layer may import the ones before it, never the ones after.
LAYERS = ("lengthgen.functional", "lengthgen.kernels", "lengthgen.attention")


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    return grimp.build_graph("lengthgen")


def _modules(graph, package: str) -> set[str]:  # noqa: ANN001
    return {package} | set(graph.find_descendants(package))


def test_functional_depends_on_nothing_else_in_lengthgen(graph) -> None:  # noqa: ANN001
    own = _modules(graph, "lengthgen.functional")
    outside = {
        (module, imported)
        for module in own
        for imported in graph.find_modules_directly_imported_by(module)
        if imported not in own
    }
    assert not outside


def test_lower_layers_never_reach_higher_ones(graph) -> None:  # noqa: ANN001
    for low, layer in enumerate(LAYERS):
        for higher in LAYERS[low + 1 :]:
            chain = graph.find_shortest_chain(importer=layer, imported=higher, as_packages=True)
            assert chain is None, f"{layer} reaches {higher}: {' -> '.join(chain)}"
    kernels = _modules(graph, "lengthgen.kernels")
    for module in kernels:
        for imported in graph.find_modules_directly_imported_by(module):
            assert imported in kernels or imported.startswith("lengthgen.functional"), (module, imported)


def test_no_import_cycles_in_the_attention_stack(graph) -> None:  # noqa: ANN001
    stack = set().union(*(_modules(graph, layer) for layer in LAYERS))
    cycles = sorted(
        (module, imported)
        for module in stack
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )
    assert not cycles, f"import cycles through: {cycles}"


def test_every_builtin_backend_lives_in_a_family_module() -> None:
    from lengthgen.attention import ATTENTION

    ATTENTION.get("softmax")
    modules = {e.obj.__module__ for e in ATTENTION.entries() if e.builtin}
    assert modules == {"lengthgen.attention.softmax_family", "lengthgen.attention.entmax_family"}
