"""The import contract of the whole package: the layers written in ``docs/design.md`` and no cycles.

The import graph comes from grimp (the graph library behind import-linter); it includes imports
made inside functions, which is where cycles usually hide. The contract is the ``layers`` block of
the design document, read here, so the document and the check cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

Layers = list[list[str]]


def read_layers(text: str, package: str = "lengthgen") -> Layers:
    """The ``layers`` block of a document, top layer first: each line that starts in the first
    column is one layer, its parts split by ``|`` and named relative to ``package`` (the package
    itself by its own name); indented lines continue a description."""
    block = re.search(r"^```layers\n(.*?)^```", text, flags=re.M | re.S)
    assert block, "no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        if not line or line[0].isspace():
            continue
        names = re.split(r"\s{2,}", line.strip())[0]
        layers.append([name if name == package else f"{package}.{name}"
                       for name in (part.strip() for part in names.split("|"))])
    return layers


def layer_of(module: str, layers: Layers) -> tuple[int, str] | None:
    """(layer index, part) of a module: the most specific part it is or lies in (a folder may be
    a part and some of its modules parts of their own); the package root only as itself."""
    matches = [(len(part), index, part) for index, parts in enumerate(layers) for part in parts
               if module == part or ("." in part and module.startswith(part + "."))]
    if not matches:
        return None
    _, index, part = max(matches)
    return index, part


def violations(graph, layers: Layers, package: str = "lengthgen") -> list[str]:  # noqa: ANN001
    """Every breach of the contract: a module in no layer, an import of a higher layer or of
    another part of the same layer, and every import cycle."""
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    found = [f"{m} is in no layer" for m in sorted(modules) if layer_of(m, layers) is None]
    for module in sorted(modules):
        mine = layer_of(module, layers)
        for imported in sorted(graph.find_modules_directly_imported_by(module) & modules):
            theirs = layer_of(imported, layers)
            if mine is None or theirs is None or mine[1] == theirs[1]:
                continue
            if theirs[0] <= mine[0]:
                found.append(f"{module} imports {imported} ({theirs[1]} is not below {mine[1]})")
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph, modules)]
    return found


def cycles(graph, modules: set[str]) -> list[list[str]]:  # noqa: ANN001
    """The strongly connected groups of more than one module (Tarjan), each as a chain of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module) & modules):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return [_chain(graph, group) for group in groups]


def _chain(graph, group: list[str]) -> list[str]:  # noqa: ANN001
    """A readable cycle through the first module of a strongly connected group."""
    start = group[0]
    back = next(m for m in group if start in graph.find_modules_directly_imported_by(m))
    path = graph.find_shortest_chain(importer=start, imported=back) or (start, back)
    return [*path, start]


@pytest.fixture(scope="module")
def layers() -> Layers:
    return read_layers(DESIGN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    return grimp.build_graph("lengthgen", cache_dir=None)


def test_the_package_keeps_the_layer_contract_of_the_design_document(graph, layers: Layers) -> None:  # noqa: ANN001
    assert layers[0] == ["lengthgen"] and layers[-1] == ["lengthgen.errors"]
    assert not violations(graph, layers)


def test_an_upward_import_or_a_cycle_breaks_the_contract(graph, layers: Layers) -> None:  # noqa: ANN001
    """The same check on the package's graph with one import it must never have: the pure math
    reaching up into the harness (which also closes a cycle through the attention stack)."""
    broken = grimp.ImportGraph()
    for module in graph.modules:
        broken.add_module(module)
        for imported in graph.find_modules_directly_imported_by(module):
            broken.add_import(importer=module, imported=imported)
    broken.add_import(importer="lengthgen.functional.entmax", imported="lengthgen.harness.run")
    found = violations(broken, layers)
    assert "lengthgen.functional.entmax imports lengthgen.harness.run (lengthgen.harness is not below " \
           "lengthgen.functional)" in found
    assert any(line.startswith("import cycle:") and "lengthgen.functional.entmax" in line for line in found)


def test_the_check_reads_real_code(tmp_path: Path) -> None:
    """On a throwaway package: an import inside a function that goes up a layer, or across to the
    other part of a layer, is found; the same package without it passes."""
    package = tmp_path / "layercake"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("VALUE = 1\n")
    (package / "left.py").write_text("from layercake.low import VALUE\n")
    (package / "right.py").write_text("from layercake import low\n")
    contract = read_layers("```layers\nlayercake   the package\nleft | right   two parts\n"
                           "low   the bottom\n```\n", "layercake")
    assert contract == [["layercake"], ["layercake.left", "layercake.right"], ["layercake.low"]]
    sys.path.insert(0, str(tmp_path))
    try:
        clean = violations(grimp.build_graph("layercake", cache_dir=None), contract, "layercake")
        (package / "low.py").write_text("VALUE = 1\n\n\ndef up():\n    from layercake import left\n\n"
                                        "    return left\n")
        (package / "right.py").write_text("from layercake import left, low\n")
        broken = violations(grimp.build_graph("layercake", cache_dir=None), contract, "layercake")
    finally:
        sys.path.remove(str(tmp_path))
    assert clean == []
    assert "layercake.low imports layercake.left (layercake.left is not below layercake.low)" in broken
    assert "layercake.right imports layercake.left (layercake.left is not below layercake.right)" in broken
    assert any(line.startswith("import cycle:") for line in broken)


# -- the architecture document against the code --------------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def architecture_chain(text: str) -> Layers:
    """The layer chain the architecture document writes out (`a` › `b | c` › …), top first."""
    chain = re.search(r"^`lengthgen` ›(.*?)\n\n", text, flags=re.M | re.S)
    assert chain, "no layer chain in the architecture document"
    groups = ("`lengthgen` ›" + chain.group(1)).split("›")
    return [[f"lengthgen.{name}" if name != "lengthgen" else name
             for name in (part.strip().strip(".`") for part in group.split("|"))] for group in groups]


def folded(layers: Layers) -> Layers:
    """The design's layers with the kernels' inner layers folded into ``kernels`` (the chain names
    the folder once; its inside is its own paragraph's business)."""
    out: Layers = []
    for parts in layers:
        parts = sorted({"lengthgen.kernels" if p.startswith("lengthgen.kernels") else p for p in parts})
        if not out or out[-1] != parts:
            out.append(parts)
    return out


def named_hubs(text: str) -> list[str]:
    """Every module a folder's paragraph names as a hub (``Hub: `x.py```, ``Hubs: `x.py` (…) and
    `y.py```), as a dotted module path found under that paragraph's folder."""
    hubs = []
    for paragraph in text.split("\n\n"):
        folder = re.match(r"\*\*`(lengthgen/[\w/]*)`\*\*", paragraph)
        if not folder:
            continue
        root = ROOT / folder.group(1)
        for sentence in re.findall(r"Hubs?: (.*?)(?:, because|\.\s|\.$)", paragraph, flags=re.S):
            for name in re.findall(r"`(\w+)\.py`", re.sub(r"\([^)]*\)", "", sentence)):
                found = sorted(p for p in root.rglob(f"{name}.py") if p.parent == root or name != "__init__")
                assert len(found) == 1, f"hub {name}.py of {folder.group(1)}: {found}"
                hubs.append(".".join(found[0].relative_to(ROOT).with_suffix("").parts))
    return hubs


def importers_within(graph, module: str) -> dict[str, int]:  # noqa: ANN001
    """For each module of ``module``'s folder, how many other modules under that folder import it."""
    folder = module.rsplit(".", 1)[0]
    under = {m for m in graph.modules if m.startswith(folder + ".")}
    packages = {m.rsplit(".", 1)[0] for m in under}
    own = {m for m in under if m.rsplit(".", 1)[0] == folder and m not in packages}
    return {m: sum(m in graph.find_modules_directly_imported_by(o) for o in under - {m}) for m in own}


def test_the_architecture_document_chains_the_design_layers(layers: Layers) -> None:
    chain = architecture_chain(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [sorted(parts) for parts in chain] == folded(layers)


def test_each_named_hub_is_among_its_folders_most_imported_modules(graph) -> None:  # noqa: ANN001
    """A hub, as the document says, is a module most of its siblings import: each one it names is
    among its folder's three most imported, and each folder's most imported module (imported
    three times or more) is named."""
    hubs = named_hubs(ARCHITECTURE.read_text(encoding="utf-8"))
    assert "lengthgen.harness.recorded.saved" in hubs and "lengthgen.kernels.cpu.jit" in hubs
    for hub in hubs:
        counts = importers_within(graph, hub)
        third = sorted(counts.values(), reverse=True)[:3][-1]
        assert counts[hub] >= max(2, third), f"{hub}: {counts[hub]} importers; the folder's {counts}"
    folders = {m.rsplit(".", 1)[0] for m in graph.modules if m.startswith("lengthgen.")}
    for folder in sorted(folders):
        counts = importers_within(graph, f"{folder}.x")
        top = max(counts.values(), default=0)
        if top >= 3:
            assert {m for m, n in counts.items() if n == top} & set(hubs), f"{folder} names no hub: {counts}"


def test_the_leaderboard_package_names_every_module() -> None:
    """Its docstring lists every module with its job (the architecture document sends readers there)."""
    import lengthgen.leaderboard as leaderboard

    folder = Path(leaderboard.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert leaderboard.__doc__ is not None
    named = set(re.findall(r"``(\w+)``", leaderboard.__doc__))
    assert modules <= named, sorted(modules - named)
