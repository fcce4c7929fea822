"""A walk of the data: follow one argument of a function through kvgate and count how often the
trip comes back into each module.

    .venv/bin/python hack/walk.py [--entry kvgate.controller.handlers:reconcile] [--data body]
                                  [--root operator] [--show-trip] [--receiver]

The data starts as one parameter of the entry function. Inside a function, a name assigned from
an expression that mentions the data carries it too (`ctx = Ctx(body=body)` makes `ctx` data).
A call that passes the data (an argument mentioning a data name) hands it to the callee's
matching parameters when the callee is a kvgate function the call resolves to statically: a
function of the same module, a name imported from a kvgate module (at the top, under
TYPE_CHECKING or inside a function: each counts as the module's), `module.function` through an
imported kvgate module, `self.method` / `Class.method`, or a method of a value whose kvgate class
the annotations tell (`spec.target.name_of(body)`, `ctx.kube.read_job(...)`): a parameter's or a
variable's annotation, a dataclass field's or a property's (`ctx.spec` where `Ctx.spec:
RolloutSpec`), a constructor (`r = SpecReader(...)`) or a function's return annotation, methods
found on the class or its kvgate bases. The data is handed through arguments only: a method
called on the data (`reader.string("key")`) is not a hand-over unless `--receiver` is given.
`x or {}` and `a if c else b` carry the data of their branches. `sim/` is not walked. An
attribute read off the data is other data (`ctx.namespace`), unless it is a holder of the data
itself: a field of a kvgate class annotated with the data's type, with a carrier (`--carrier`,
default `Ctx`: the reconcile's context, which `begin` builds of the parsed body and which holds
no field of the body's type), or with a class that holds either (`begun.ctx`, where `Begun.ctx:
Ctx`). A tuple that holds the data is the data.

The trip is the sequence of modules the data is in, depth first: into the callee, and back into
the caller when the callee returns. Each function is walked once; a later hand-over to a walked
function is still a trip there and back. A module's re-entries are the times the trip enters it
after the first; the returns are the stays less the modules (every entry after a module's
first). Issue 20 asked for at most 5 re-entries of every module, from `reconcile`; issue 38 for
at most 60 stays and 20 returns, and no module entered more than 3 times.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    params: list[str]


@dataclass
class Module:
    name: str
    functions: dict[str, Function] = field(default_factory=dict)
    # local name -> ("module", "kvgate.x") or ("attr", "kvgate.x", "name")
    imports: dict[str, tuple[str, ...]] = field(default_factory=dict)
    classes: set[str] = field(default_factory=set)
    # class name -> {field: annotation source}
    fields: dict[str, dict[str, str]] = field(default_factory=dict)
    # class name -> its bases' source (`RestForge`, `base.Forge`)
    bases: dict[str, list[str]] = field(default_factory=dict)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _decorators(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {ast.unparse(d).rpartition(".")[2] for d in node.decorator_list}


def load(source_root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((source_root / "kvgate").rglob("*.py")):
        rel = path.relative_to(source_root).with_suffix("")
        parts = list(rel.parts)
        if "sim" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        mod = Module(name)
        tree = ast.parse(path.read_text(), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                mod.functions[node.name] = Function(name, node.name, node, _params(node))
            elif isinstance(node, ast.ClassDef):
                mod.classes.add(node.name)
                mod.bases[node.name] = [ast.unparse(b) for b in node.bases]
                mod.fields[node.name] = {
                    item.target.id: ast.unparse(item.annotation)
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        q = f"{node.name}.{item.name}"
                        static = "staticmethod" in _decorators(item)
                        params = _params(item) if static else _params(item)[1:]
                        mod.functions[q] = Function(name, q, item, params)
        # Imports under `if TYPE_CHECKING:` and inside functions name kvgate modules too: an
        # annotation or a deferred call resolves through them as through a top-level import.
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = package.split(".")
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                if not base.startswith("kvgate"):
                    continue
                for alias in node.names:
                    local = alias.asname or alias.name
                    mod.imports.setdefault(local, ("attr", base, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("kvgate"):
                        mod.imports.setdefault(alias.asname or alias.name, ("module", alias.name))
        modules[name] = mod
    return modules


def holder_fields(
    modules: dict[str, Module], data_type: str, carriers: tuple[str, ...] = ()
) -> frozenset[str]:
    """The field names of kvgate classes that hold the data: annotated with its type, with a
    carrier (a class built from the data: `Ctx`, which `begin` makes of the parsed body), or
    with a class that holds either (to a fixed point)."""
    holders = {data_type.rpartition(".")[2], *carriers}
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for mod in modules.values():
            for cls, fields in mod.fields.items():
                for name, annotation in fields.items():
                    words = set(annotation.replace(".", " ").replace("|", " ").split())
                    if words & holders and name not in names:
                        names.add(name)
                        changed = True
                    if words & holders and cls not in holders:
                        holders.add(cls)
                        changed = True
    return frozenset(names)


Type = tuple[str, str]  # a kvgate class: (module, class name)


class Walker:
    def __init__(
        self,
        modules: dict[str, Module],
        holders: frozenset[str] = frozenset(),
        *,
        annotations: bool = False,
        receiver: bool = False,
    ):
        self.modules = modules
        self.annotations = annotations  # follow calls on values typed by annotations
        self.receiver = receiver
        self.walked: set[str] = set()
        self.trip: list[str] = []
        self.calls: Counter[str] = Counter()  # hand-overs into each module from another
        self.holders = holders  # attributes that carry the data (`holder_fields`)

    def _key(self, fn: Function) -> str:
        return f"{fn.module}:{fn.qualname}"

    # --- types from annotations --------------------------------------------------------------

    def class_named(self, mod: Module, source: str) -> Type | None:
        """The kvgate class an annotation in `mod` names (`Ctx`, `Ctx | None`, `"Ctx"`,
        `status.RolloutStatus`); None for anything else (a union of two classes, a container,
        a type from outside kvgate)."""
        text = source.strip().strip("'\"")
        if text.startswith("Optional[") and text.endswith("]"):
            text = text[len("Optional[") : -1]
        parts = [p.strip() for p in text.split("|") if p.strip() not in ("None", "")]
        if len(parts) != 1:
            return None
        base, _, name = parts[0].rpartition(".")
        if not base and name in mod.classes:
            return (mod.name, name)
        imp = mod.imports.get(base or name)
        if imp is None:
            return None
        if not base:  # `from kvgate.x import Class` (or `... import Class as Name`)
            owner = self.modules.get(imp[1]) if imp[0] == "attr" else None
            if owner is None or imp[2] not in owner.classes:
                return None
            return (owner.name, imp[2])
        owner = self.modules.get(imp[1] if imp[0] == "module" else f"{imp[1]}.{imp[2]}")
        return (owner.name, name) if owner is not None and name in owner.classes else None

    def _lineage(self, typ: Type) -> list[Type]:
        """The class, then its kvgate bases, nearest first."""
        order: list[Type] = []
        todo = [typ]
        while todo:
            t = todo.pop(0)
            if t in order or t[0] not in self.modules:
                continue
            order.append(t)
            mod = self.modules[t[0]]
            todo += [b for b in (self.class_named(mod, s) for s in mod.bases.get(t[1], [])) if b]
        return order

    def method(self, typ: Type, name: str) -> Function | None:
        for module, cls in self._lineage(typ):
            fn = self.modules[module].functions.get(f"{cls}.{name}")
            if fn is not None:
                return fn
        return None

    def _returns(self, fn: Function) -> Type | None:
        returns = fn.node.returns
        if returns is None:
            return None
        return self.class_named(self.modules[fn.module], ast.unparse(returns))

    def attribute_type(self, typ: Type, name: str) -> Type | None:
        """The class of `value.name` for a `typ` value: the field's annotation (a dataclass
        field, a class attribute), or a property's return annotation."""
        for module, cls in self._lineage(typ):
            mod = self.modules[module]
            annotation = mod.fields.get(cls, {}).get(name)
            if annotation is not None:
                return self.class_named(mod, annotation)
            fn = mod.functions.get(f"{cls}.{name}")
            if fn is not None:
                return self._returns(fn) if "property" in _decorators(fn.node) else None
        return None

    def type_of(
        self, mod: Module, expr: ast.expr, types: dict[str, Type], cls: str | None
    ) -> Type | None:
        """The kvgate class of an expression's value, as far as annotations tell: a typed name,
        an attribute of a typed value, a class's constructor, a call's return annotation."""
        if isinstance(expr, ast.Name):
            return types.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.type_of(mod, expr.value, types, cls)
            return None if owner is None else self.attribute_type(owner, expr.attr)
        if isinstance(expr, ast.Await):
            return self.type_of(mod, expr.value, types, cls)
        if isinstance(expr, ast.Call):
            constructed = self.class_named(mod, ast.unparse(expr.func))
            if constructed is not None:
                return constructed
            callee = self.resolve(mod, expr, cls, types)
            return None if callee is None else self._returns(callee)
        return None

    def local_types(self, fn: Function, cls: str | None) -> dict[str, Type]:
        """The names of `fn` whose class annotations tell: `self`, annotated parameters and
        variables, and names assigned a value of a known class (`ctx = Ctx(...)`)."""
        mod = self.modules[fn.module]
        types: dict[str, Type] = {}
        if cls is not None and "staticmethod" not in _decorators(fn.node):
            types["self"] = (fn.module, cls)
        a = fn.node.args
        for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
            typ = None if p.annotation is None else self.class_named(mod, ast.unparse(p.annotation))
            if typ is not None:
                types[p.arg] = typ
        for node in _in_order(fn.node):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                typ = self.class_named(mod, ast.unparse(node.annotation))
                if typ is not None:
                    types.setdefault(node.target.id, typ)
            elif isinstance(node, ast.Assign):
                for name, value in _pairs(node):
                    typ = self.type_of(mod, value, types, cls)
                    if typ is not None:
                        types.setdefault(name, typ)
        return types

    # --- calls -------------------------------------------------------------------------------

    def resolve(
        self,
        mod: Module,
        call: ast.Call,
        cls: str | None,
        types: dict[str, Type] | None = None,
    ) -> Function | None:
        found = self._resolve_static(mod, call, cls)
        f = call.func
        if found is None and self.annotations and types and isinstance(f, ast.Attribute):
            owner = self.type_of(mod, f.value, types, cls)  # a method of a typed value
            found = None if owner is None else self.method(owner, f.attr)
        return found

    def _resolve_static(self, mod: Module, call: ast.Call, cls: str | None) -> Function | None:
        f = call.func
        if isinstance(f, ast.Name):
            if f.id in mod.functions:
                return mod.functions[f.id]
            if f.id in mod.classes:
                return mod.functions.get(f"{f.id}.__init__")
            imp = mod.imports.get(f.id)
            if imp and imp[0] == "attr":
                target = self.modules.get(imp[1])
                if target is None:  # `from kvgate import module` then `module(...)`: not a call
                    return None
                return target.functions.get(imp[2]) or target.functions.get(f"{imp[2]}.__init__")
            return None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base = f.value.id
            if base == "self" and cls:
                return mod.functions.get(f"{cls}.{f.attr}")
            if base in mod.classes:
                return mod.functions.get(f"{base}.{f.attr}")
            imp = mod.imports.get(base)
            if imp is None:
                return None
            target_name = imp[1] if imp[0] == "module" else f"{imp[1]}.{imp[2]}"
            target = self.modules.get(target_name)
            if target is not None:
                return target.functions.get(f.attr)
            if imp[0] == "attr":  # an imported class: Class.method
                owner = self.modules.get(imp[1])
                if owner is not None:
                    return owner.functions.get(f"{imp[2]}.{f.attr}")
        return None

    def _enter(self, module: str) -> None:
        if not self.trip or self.trip[-1] != module:
            self.trip.append(module)

    def walk(self, fn: Function, data: set[str]) -> None:
        if self.trip and self.trip[-1] != fn.module:
            self.calls[fn.module] += 1
        self._enter(fn.module)
        key = self._key(fn)
        if key in self.walked or not data:
            return
        self.walked.add(key)
        mod = self.modules[fn.module]
        cls = fn.qualname.split(".")[0] if "." in fn.qualname else None
        types = self.local_types(fn, cls)
        carried = set(data)
        changed = True
        while changed:  # names assigned from the data carry it too
            changed = False
            for node in ast.walk(fn.node):
                targets: list[ast.expr] = []
                value: ast.expr | None = None
                if isinstance(node, ast.Assign):
                    targets, value = list(node.targets), node.value
                elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                elif isinstance(node, ast.For):  # (a comprehension's names are its own)
                    targets, value = [node.target], node.iter
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    targets, value = [node.optional_vars], node.context_expr
                elif isinstance(node, ast.NamedExpr):
                    targets, value = [node.target], node.value
                if value is None or not _mentions(value, carried, self.holders, self.annotations):
                    continue
                for t in targets:
                    for name in _bound(t):
                        if name not in carried:
                            carried.add(name)
                            changed = True
        calls = sorted(
            _calls(fn.node, carried, self.holders, self.annotations),
            key=lambda c: (c[0].lineno, c[0].col_offset),
        )
        for call, carried in calls:
            callee = self.resolve(mod, call, cls, types)
            if callee is None:
                continue
            handed: set[str] = set()
            if (  # --receiver: a method of the data (or of a holder of it) has it as `self`
                self.receiver
                and "." in callee.qualname
                and "staticmethod" not in _decorators(callee.node)
                and isinstance(call.func, ast.Attribute)
                and _mentions(call.func.value, carried, self.holders, self.annotations)
            ):
                handed.add("self")
            for i, arg in enumerate(call.args):
                if _mentions(arg, carried, self.holders, self.annotations) and i < len(
                    callee.params
                ):
                    handed.add(callee.params[i])
            for kw in call.keywords:
                if (
                    kw.arg
                    and _mentions(kw.value, carried, self.holders, self.annotations)
                    and kw.arg in callee.params
                ):
                    handed.add(kw.arg)
            if not handed:
                continue
            self.walk(callee, handed)
            self._enter(fn.module)  # the callee returns


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _pairs(node: ast.Assign) -> list[tuple[str, ast.expr]]:
    """(name, value) of an assignment: `a = b = v`, and `a, b = x, y` element by element."""
    pairs: list[tuple[str, ast.expr]] = []
    for target in node.targets:
        if isinstance(target, ast.Name):
            pairs.append((target.id, node.value))
        elif (
            isinstance(target, ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(target.elts) == len(node.value.elts)
        ):
            pairs += [
                (t.id, v)
                for t, v in zip(target.elts, node.value.elts, strict=True)
                if isinstance(t, ast.Name)
            ]
    return pairs


def _in_order(node: ast.AST) -> list[ast.AST]:
    """The nodes under `node` in source order (an assignment's type is known before its use)."""
    nodes = [n for n in ast.walk(node) if hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _scope(
    expr: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp,
    names: set[str],
    holders: frozenset[str],
    branches: bool = False,
) -> set[str]:
    """The data names inside a comprehension: its targets carry the data when their iterable
    does, and shadow the outer names they rebind when it does not."""
    inner = set(names)
    for gen in expr.generators:
        bound = set(_bound(gen.target))
        inner = inner | bound if _mentions(gen.iter, inner, holders, branches) else inner - bound
    return inner


def _calls(
    node: ast.AST, names: set[str], holders: frozenset[str], branches: bool = False
) -> list[tuple[ast.Call, set[str]]]:
    """Every call under `node` with the data names in its scope (a comprehension's own)."""
    found: list[tuple[ast.Call, set[str]]] = []
    if isinstance(node, ast.Call):
        found.append((node, names))
    if isinstance(node, _COMPREHENSIONS):
        inner = _scope(node, names, holders, branches)
        for gen in node.generators:  # the first iterable is evaluated outside
            found += _calls(
                gen.iter, names if gen is node.generators[0] else inner, holders, branches
            )
            for cond in gen.ifs:
                found += _calls(cond, inner, holders, branches)
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for part in parts:
            found += _calls(part, inner, holders, branches)
        return found
    for child in ast.iter_child_nodes(node):
        found += _calls(child, names, holders, branches)
    return found


def _bound(target: ast.expr) -> list[str]:
    """The names an assignment target binds or changes: `a`, `a, b`; `a[key] = x` and
    `a.attr = x` change `a` (the key is not data: `pods[arm] = data` carries `pods`)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for elt in target.elts for n in _bound(elt)]
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, ast.Subscript | ast.Attribute):
        return _bound(target.value)
    return []


def _mentions(
    expr: ast.AST, names: set[str], holders: frozenset[str] = frozenset(), branches: bool = False
) -> bool:
    """The expression is the data, or hands the data itself to a call (`Ctx(body=body)`,
    `ctx.seeing(done)`), or holds it (`(ctx, phase)`, `begun.ctx`); an attribute or item read off
    it (`ctx.namespace`) is other data."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Starred | ast.Await):
        return _mentions(expr.value, names, holders, branches)
    if isinstance(expr, ast.BoolOp) and branches:  # `body.get("status") or {}`: the status
        return any(_mentions(v, names, holders, branches) for v in expr.values)
    if isinstance(expr, ast.IfExp) and branches:
        return _mentions(expr.body, names, holders, branches) or _mentions(
            expr.orelse, names, holders, branches
        )
    if isinstance(expr, ast.Tuple | ast.List):
        return any(_mentions(e, names, holders, branches) for e in expr.elts)
    if isinstance(expr, _COMPREHENSIONS):
        inner = _scope(expr, names, holders, branches)
        parts = [expr.key, expr.value] if isinstance(expr, ast.DictComp) else [expr.elt]
        return _mentions(expr.generators[0].iter, names, holders, branches) or any(
            _mentions(e, inner, holders, branches) for e in parts
        )
    if isinstance(expr, ast.Attribute):
        return expr.attr in holders and _mentions(expr.value, names, holders, branches)
    if isinstance(expr, ast.Call):
        f = expr.func
        if isinstance(f, ast.Attribute) and _mentions(f.value, names, holders, branches):
            return True  # a method of the data returns (a view of) the data
        return any(_mentions(a, names, holders, branches) for a in expr.args) or any(
            _mentions(k.value, names, holders, branches) for k in expr.keywords
        )
    return False


def _annotation(fn: Function, param: str) -> str:
    """The source of `param`'s annotation in `fn` ('' without one)."""
    a = fn.node.args
    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        if p.arg == param and p.annotation is not None:
            return ast.unparse(p.annotation)
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT / "operator")
    parser.add_argument("--entry", default="kvgate.controller.handlers:reconcile")
    parser.add_argument("--data", default="body", help="the entry's parameter to follow")
    parser.add_argument(
        "--carrier",
        action="append",
        default=None,
        help="a class built from the data that carries it on (default: Ctx, the reconcile's "
        "context, made of the parsed body; --carrier '' for none)",
    )
    parser.add_argument("--show-trip", action="store_true")
    parser.add_argument(
        "--no-annotations",
        action="store_true",
        help="issue 20's walk: no calls on values typed by annotations",
    )
    parser.add_argument(
        "--receiver",
        action="store_true",
        help="count a method called on the data (`reader.string(key)`) as handing it over",
    )
    args = parser.parse_args(argv)
    modules = load(args.root)
    module, _, qualname = args.entry.partition(":")
    if module not in modules or qualname not in modules[module].functions:
        print(f"walk: no function {args.entry} under {args.root}", file=sys.stderr)
        return 2
    entry = modules[module].functions[qualname]
    carriers = tuple(c for c in (args.carrier if args.carrier is not None else ["Ctx"]) if c)
    holders = holder_fields(modules, _annotation(entry, args.data), carriers)
    walker = Walker(modules, holders, annotations=not args.no_annotations, receiver=args.receiver)
    walker.walk(entry, {args.data})
    entries = Counter(walker.trip)
    print(f"walk of {args.data!r} from {args.entry}: {len(walker.walked)} functions, "
          f"{len(walker.trip)} stays, {len(entries)} modules")  # fmt: skip
    print("re-entries by module (entries after the first):")
    for name, count in entries.most_common():
        print(f"  {count - 1:4d}  {name}")
    print("called into by module (hand-overs from another module; returns not counted):")
    for name, count in walker.calls.most_common():
        print(f"  {count:4d}  {name}")
    if args.show_trip:
        print(" -> ".join(walker.trip))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `walk.py | head`: the reader has what it wanted
        sys.stderr.close()
        raise SystemExit(0) from None
