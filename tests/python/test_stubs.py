"""The type stub python/statepool/_core.pyi against the module it describes.

The stub is parsed with ``ast`` and compared with what pybind11 built, both ways, so that the
two cannot drift apart:

- every name of statepool._core (module attributes, classes, and each class's members that the
  binding defines) is in the stub, with the same kind (class, function, method, static method,
  property, attribute); every name the stub defines exists in the module (the stub's own type
  aliases aside);
- every function and method, overload by overload, has the parameters pybind11 lists in its
  ``__doc__`` signature (``name(a: int = 0, *, b: str = '') -> T``; ``1. ...`` ``2. ...`` for
  overloads): the same names in the same order, the same ``*`` (keyword-only) and positional-only
  parameters, the same defaults, and types and return types that agree;
- properties are read-only on both sides and their types agree with the getters';
- every stub member has a docstring, and where the C++ code gives one the stub's repeats it.

The checks collect problems as text; test_the_checks_catch_drift makes sure they report a
stub that lost a member, a parameter, a marker, a default or an overload. No daemon is needed.
"""

from __future__ import annotations

import ast
import builtins
import operator
import os
import pathlib
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

import statepool
from statepool import _core

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
STUB_PATH = SOURCE_DIR / "python" / "statepool" / "_core.pyi"

# Public names the stub may define that the module does not have (type aliases for annotations).
STUB_ONLY = {"DTypeLike"}
# Class attributes that are not the binding's own definitions: Python's, and pybind11's
# internals and enum plumbing. The stub may describe them (then they are checked) but need not.
NOT_BINDING = {"__doc__", "__module__", "__dict__", "__weakref__", "__qualname__",
               "__entries", "__members__", "_pybind11_conduit_v1_"}
ENUM_PLUMBING = {"__eq__", "__ne__", "__hash__", "__getstate__", "__setstate__", "__repr__",
                 "__str__", "__index__"}
MODULE_DUNDERS = {"__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__",
                  "__builtins__", "__cached__", "__path__"}


# --- the stub --------------------------------------------------------------------------------

@dataclass
class StubMember:
    """A name the stub binds in a module or class body."""

    name: str
    kind: str  # "class", "function" (module level), "method", "staticmethod", "property",
    # "attribute", "alias", "import"
    nodes: list[ast.AST] = field(default_factory=list)  # FunctionDef overloads, or one node
    doc: Optional[str] = None  # attribute docstring (the string after an assignment)
    members: dict[str, StubMember] = field(default_factory=dict)  # of a class
    setter: bool = False  # a property with @x.setter


def _version_condition(test: ast.expr) -> bool:
    """The value of ``sys.version_info <op> (x, y)`` for this interpreter."""
    ops = {ast.GtE: operator.ge, ast.Gt: operator.gt, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
    if (isinstance(test, ast.Compare) and len(test.ops) == 1
            and ast.unparse(test.left) == "sys.version_info" and type(test.ops[0]) in ops):
        version = ast.literal_eval(test.comparators[0])
        return ops[type(test.ops[0])](sys.version_info[:len(version)], version)
    raise ValueError(f"unsupported condition in the stub: {ast.unparse(test)}")


def _decorators(fn: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in fn.decorator_list]


def _walk_body(body: list[ast.stmt], in_class: bool) -> dict[str, StubMember]:
    """The names a module or class body binds, in order (version checks evaluated)."""
    members: dict[str, StubMember] = {}
    last: Optional[StubMember] = None

    def statements(stmts):
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                yield from statements(stmt.body if _version_condition(stmt.test) else stmt.orelse)
            else:
                yield stmt

    for stmt in statements(body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str):
            if last is not None and last.kind in ("attribute", "alias"):
                last.doc = stmt.value.value  # an attribute docstring
            last = None
            continue
        last = None
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                name = alias.asname or alias.name.split(".")[0]
                members[name] = StubMember(name, "import", [stmt])
        elif isinstance(stmt, ast.ClassDef):
            members[stmt.name] = StubMember(stmt.name, "class", [stmt],
                                            members=_walk_body(stmt.body, True))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = _decorators(stmt)
            if any(d.endswith(".setter") for d in decorators):
                members[stmt.name].setter = True
                continue
            if "property" in decorators:
                kind = "property"
            elif "staticmethod" in decorators:
                kind = "staticmethod"
            else:
                kind = "method" if in_class else "function"
            if stmt.name in members and "overload" in decorators:
                members[stmt.name].nodes.append(stmt)
            else:
                members[stmt.name] = StubMember(stmt.name, kind, [stmt])
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            kind = "alias" if ast.unparse(stmt.annotation).endswith("TypeAlias") else "attribute"
            last = members[stmt.target.id] = StubMember(stmt.target.id, kind, [stmt])
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            last = members[stmt.targets[0].id] = StubMember(stmt.targets[0].id, "attribute", [stmt])
        elif not isinstance(stmt, ast.Pass):
            raise ValueError(f"unsupported statement in the stub: {ast.unparse(stmt)[:60]}")
    return members


@dataclass
class Stub:
    tree: ast.Module
    members: dict[str, StubMember]
    aliases: dict[str, Any]


def parse_stub(text: str) -> Stub:
    tree = ast.parse(text)
    members = _walk_body(tree.body, False)
    aliases: dict[str, Any] = {}
    for m in members.values():
        if m.kind == "alias":
            aliases[m.name] = canon(m.nodes[0].value, aliases)
        elif m.kind == "import" and isinstance(m.nodes[0], ast.ImportFrom):
            for alias in m.nodes[0].names:
                if alias.asname == m.name:
                    aliases[m.name] = alias.name
    return Stub(tree, members, aliases)


# --- types -----------------------------------------------------------------------------------
# Both sides' annotations become one canonical form: a name ("int", "Plan"), a generic
# ("list", (args...)), or a frozenset for a union. pybind11 spells List[X], Optional[X] and
# statepool._core.X; the stub list[X] / Sequence[X], X | None and X.

_GENERIC_NAMES = {"List": "list", "Dict": "dict", "Tuple": "tuple", "Set": "set",
                  "Sequence": "list", "FrozenSet": "frozenset"}
_OPAQUE = {"object", "handle", "capsule"}  # pybind11's py::object & co: any stub type


def _union(*items):
    out = set()
    for item in items:
        out |= item if isinstance(item, frozenset) else {item}
    return next(iter(out)) if len(out) == 1 else frozenset(out)


def canon(node: Optional[ast.AST], aliases: dict[str, Any], self_name: Optional[str] = None):
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        if node.value is None:
            return "None"
        if node.value is Ellipsis:
            return "..."
        if isinstance(node.value, str):
            return canon(ast.parse(node.value, mode="eval").body, aliases, self_name)
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name in aliases:
            return aliases[name]
        if name == "Self":
            return self_name
        return _GENERIC_NAMES.get(name, name)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union(canon(node.left, aliases, self_name), canon(node.right, aliases, self_name))
    if isinstance(node, ast.Subscript):
        base = canon(node.value, aliases, self_name)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        args = [canon(a, aliases, self_name) for a in args]
        if base == "Optional":
            return _union(args[0], "None")
        if base == "Union":
            return _union(*args)
        if base in ("ClassVar", "Final"):
            return args[0]
        return (base, tuple(args))
    return ast.unparse(node)


def runtime_type(text: Optional[str]):
    """The canonical form of a type as pybind11 prints it; None when it is no Python type."""
    if text is None:
        return None
    try:
        return canon(ast.parse(text.strip(), mode="eval").body, {})
    except SyntaxError:  # e.g. a C++ name of a class bound after the function
        return None


def types_agree(rt, st, default_none: bool = False) -> bool:
    if rt is None or rt in _OPAQUE:
        return True  # the stub may be more precise than py::object
    if rt in ("tuple", "dict", "list"):
        return st == rt or (isinstance(st, tuple) and st[0] == rt)
    if isinstance(rt, tuple) and isinstance(st, tuple) and rt[0] == st[0] and \
            len(rt[1]) == len(st[1]):  # a container: its element types, one by one
        return all(types_agree(r, t) for r, t in zip(rt[1], st[1]))
    if st == rt:
        return True
    # None passes for a default of None, and for the module's classes: pybind11 holds them by
    # (shared) pointers, which may be null, and its signatures cannot say so.
    nullable = default_none or (isinstance(rt, str) and isinstance(getattr(_core, rt, None), type))
    return nullable and st == _union(rt, "None")


# --- pybind11 signatures -----------------------------------------------------------------------

@dataclass
class Param:
    token: str  # name, "*args", "**kwargs", or the markers "*" and "/"
    type: Any = None
    default: Any = None  # None: no default; else (tag, value)
    has_type: bool = False


def _split_top(text: str) -> list[str]:
    """Splits at commas outside brackets and quotes."""
    parts, current, depth, quote = [], [], 0, None
    i = 0
    while i < len(text):
        ch = text[i]
        current.append(ch)
        if quote:
            if ch == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            current.pop()
            parts.append("".join(current).strip())
            current = []
        i += 1
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _closing_paren(text: str, start: int) -> int:
    depth, quote = 0, None
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1] == "-"):
            depth -= 1
            if depth == 0:
                return i
    return -1


def _default(text: str):
    enum = re.fullmatch(r"<(\w+)\.(\w+): -?\d+>", text)
    if enum:
        return ("expr", f"{enum.group(1)}.{enum.group(2)}")
    try:
        value = ast.literal_eval(text)
        return ("literal", type(value), value)
    except (ValueError, SyntaxError):
        return ("expr", text)


@dataclass
class Signature:
    params: list[Param]
    returns: Any
    text: str


def parse_signature(line: str) -> Optional[Signature]:
    """``name(a: int = 0, *, b: str = '') -> T`` (the name is optional, as in getters' docs)."""
    m = re.match(r"\s*([A-Za-z_]\w*)?\(", line)
    if not m:
        return None
    close = _closing_paren(line, m.end() - 1)
    if close < 0:
        return None
    rest = line[close + 1:].strip()
    if rest and not rest.startswith("->"):
        return None
    params: list[Param] = []
    saw_positional_only = False
    for part in _split_top(line[m.end():close]):
        if part in ("*", "/"):
            params.append(Param(part))
            saw_positional_only |= part == "/"
            continue
        name, _, rest_of = part.partition(":")
        default = None
        if not _:
            name, eq, value = part.partition("=")
            type_text = None
            if eq:
                default = _default(value.strip())
        else:
            type_text, eq, value = rest_of.partition(" = ")
            if eq:
                default = _default(value.strip())
        params.append(Param(name.strip(), runtime_type(type_text), default,
                            has_type=type_text is not None))
    # pybind11's unnamed arguments (arg0, arg1, ...) cannot be passed by keyword.
    unnamed = [i for i, p in enumerate(params) if re.fullmatch(r"arg\d+", p.token)]
    if unnamed and not saw_positional_only:
        params.insert(unnamed[-1] + 1, Param("/"))
    returns = runtime_type(rest[2:]) if rest else None
    return Signature(params, returns, line.strip())


def runtime_overloads(obj) -> list[tuple[Signature, str]]:
    """(signature, docstring) of each overload, from a pybind11 function's __doc__."""
    lines = (obj.__doc__ or "").split("\n")
    if len(lines) > 1 and lines[1] == "Overloaded function.":
        out: list[tuple[Signature, list[str]]] = []
        for line in lines[2:]:
            m = re.match(r"(\d+)\. (.*)$", line)
            sig = parse_signature(m.group(2)) if m and int(m.group(1)) == len(out) + 1 else None
            if sig is not None:
                out.append((sig, []))
            elif out:
                out[-1][1].append(line)
        return [(sig, "\n".join(doc)) for sig, doc in out]
    sig = parse_signature(lines[0])
    return [(sig, "\n".join(lines[1:]))] if sig is not None else []


def stub_signature(fn: ast.FunctionDef, stub: Stub, self_name: Optional[str]) -> Signature:
    a = fn.args
    params: list[Param] = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)

    def param(arg: ast.arg, default, token=None):
        return Param(token or arg.arg, canon(arg.annotation, stub.aliases, self_name),
                     None if default is None else _stub_default(default),
                     has_type=arg.annotation is not None)

    for i, arg in enumerate(positional):
        params.append(param(arg, defaults[i]))
        if a.posonlyargs and i == len(a.posonlyargs) - 1:
            params.append(Param("/"))
    if a.vararg:
        params.append(param(a.vararg, None, "*" + a.vararg.arg))
    elif a.kwonlyargs:
        params.append(Param("*"))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(param(arg, default))
    if a.kwarg:
        params.append(param(a.kwarg, None, "**" + a.kwarg.arg))
    return Signature(params, canon(fn.returns, stub.aliases, self_name), f"def {fn.name}(...)")


NONE_DEFAULT = ("literal", type(None), None)


def _stub_default(node: ast.AST):
    try:
        value = ast.literal_eval(node)
        return ("literal", type(value), value)
    except ValueError:
        return ("expr", ast.unparse(node))


# --- docstrings --------------------------------------------------------------------------------

def _norm(text: Optional[str]) -> str:
    return " ".join((text or "").split())


def doc_problems(where: str, stub_doc: Optional[str], runtime_doc: Optional[str]) -> list[str]:
    """The stub's docstring must exist and repeat the C++ one (plus an optional 'Stub note:')."""
    if not _norm(stub_doc):
        return [f"{where}: no docstring in the stub"]
    stub_text, runtime_text = _norm(stub_doc), _norm(runtime_doc)
    if runtime_text and not (stub_text == runtime_text or
                             stub_text.startswith(runtime_text + " Stub note:")):
        return [f"{where}: the stub's docstring {stub_text[:70]!r}... does not repeat the "
                f"module's {runtime_text[:70]!r}..."]
    return []


def _is_signature_only(doc: Optional[str]) -> bool:
    lines = (doc or "").strip().split("\n")
    return len(lines) == 1 and parse_signature(lines[0]) is not None


def class_doc(cls: type) -> str:
    doc = cls.__doc__ or ""
    if "__members__" in vars(cls):  # pybind11 appends the enum's members
        doc = re.sub(r"(?s)(^|\n\n)Members:\n.*$", "", doc)
    return doc


# --- the comparison ----------------------------------------------------------------------------

def _is_enum(cls: type) -> bool:
    return "__members__" in vars(cls)


def runtime_kind(value: Any) -> str:
    if type(value).__name__ == "pybind11_static_property":
        return "attribute"  # class-level, e.g. an enum's __members__
    if isinstance(value, property):
        return "property"
    if isinstance(value, staticmethod):
        return "staticmethod"
    if isinstance(value, (types.WrapperDescriptorType, types.MethodWrapperType)):
        return "slot"  # a C slot (e.g. the no-constructor __init__, or 3.12's __buffer__)
    if isinstance(value, type):
        return "class"
    if callable(value) and runtime_overloads(value):
        return "method"
    return "attribute"


def runtime_members(cls: type) -> dict[str, Any]:
    """What the binding defines on a class: its own dictionary less Python's and pybind11's."""
    return {name: value for name, value in vars(cls).items()
            if name not in NOT_BINDING and runtime_kind(value) != "slot"}


def _value_type(value: Any):
    if value is None:
        return "None"
    return type(value).__name__


def _shown(default) -> str:
    return "none" if default is None else repr(default[-1])


def compare_function(where: str, member: StubMember, runtime: Any, stub: Stub,
                     self_name: Optional[str]) -> list[str]:
    problems: list[str] = []
    fns = member.nodes
    if len(fns) > 1 and not all("overload" in _decorators(f) for f in fns):
        problems.append(f"{where}: several definitions that are not all @overload")
    if len(fns) == 1 and "overload" in _decorators(fns[0]):
        problems.append(f"{where}: a single @overload")
    overloads = runtime_overloads(runtime)
    if not overloads:
        return problems + [f"{where}: no pybind11 signature in the module's __doc__"]
    if len(overloads) != len(fns):
        return problems + [f"{where}: {len(fns)} definition(s) in the stub, {len(overloads)} "
                           f"overload(s) in the module"]
    for i, (fn, (rt, rt_doc)) in enumerate(zip(fns, overloads)):
        at = f"{where} (overload {i + 1})" if len(fns) > 1 else where
        st = stub_signature(fn, stub, self_name)
        rt_tokens = [p.token for p in rt.params]
        st_tokens = [p.token for p in st.params]
        if rt_tokens != st_tokens:
            problems.append(f"{at}: parameters {st_tokens} in the stub, {rt_tokens} in the module "
                            f"({rt.text})")
            continue
        for rp, sp in zip(rt.params, st.params):
            if rp.token in ("*", "/", "self"):
                continue
            if rp.default != sp.default:
                problems.append(f"{at}: default of {rp.token} is {_shown(sp.default)} in the "
                                f"stub, {_shown(rp.default)} in the module")
            if not sp.has_type:
                problems.append(f"{at}: {sp.token} has no type in the stub")
            elif rp.has_type and not types_agree(rp.type, sp.type,
                                                 rp.default == NONE_DEFAULT):
                problems.append(f"{at}: {rp.token} is {sp.type} in the stub, {rp.type} in the module")
        if fn.returns is None:
            problems.append(f"{at}: no return type in the stub")
        elif not types_agree(rt.returns, st.returns):
            problems.append(f"{at}: returns {st.returns} in the stub, {rt.returns} in the module")
        problems += doc_problems(at, ast.get_docstring(fn), rt_doc)
    return problems


def compare_member(where: str, member: StubMember, runtime: Any, owner: Optional[type],
                   stub: Stub) -> list[str]:
    kind = runtime_kind(runtime)
    self_name = owner.__name__ if owner is not None else None
    stub_kind = "method" if member.kind == "function" else member.kind
    if kind == "slot":
        return [] if stub_kind == "method" else [f"{where}: a C slot in the module, a "
                                                 f"{member.kind} in the stub"]
    if stub_kind != kind:
        return [f"{where}: a {kind} in the module, a {member.kind} in the stub"]
    if kind in ("method", "staticmethod"):
        target = getattr(owner, member.name) if kind == "staticmethod" else runtime
        return compare_function(where, member, target, stub, self_name)
    if kind == "property":
        fn = member.nodes[0]
        problems = []
        if (runtime.fset is not None) != member.setter:
            problems.append(f"{where}: {'writable' if runtime.fset else 'read-only'} in the "
                            f"module, not in the stub")
        getter = runtime_overloads(runtime.fget)
        if fn.returns is None:
            problems.append(f"{where}: no type in the stub")
        elif getter and not types_agree(getter[0][0].returns,
                                        canon(fn.returns, stub.aliases, self_name)):
            problems.append(f"{where}: {canon(fn.returns, stub.aliases, self_name)} in the stub, "
                            f"{getter[0][0].returns} in the module")
        runtime_doc = None if _is_signature_only(runtime.__doc__) else runtime.__doc__
        return problems + doc_problems(where, ast.get_docstring(fn), runtime_doc)
    if kind == "class":
        return []  # compared by compare_class
    # an attribute: compare its value (what the class or module gives, not a descriptor)
    if owner is not None:
        runtime = getattr(owner, member.name)
    node = member.nodes[0]
    problems = doc_problems(where, member.doc, None)
    annotation = getattr(node, "annotation", None)
    st = canon(annotation, stub.aliases, self_name)
    if st == "Final" or annotation is None:  # the type comes from the value
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, AttributeError):
            return problems + [f"{where}: neither a type nor a literal value in the stub"]
        if value != runtime:
            problems.append(f"{where}: {value!r} in the stub, {runtime!r} in the module")
        return problems
    expected = _value_type(runtime)
    base = st[0] if isinstance(st, tuple) else st
    if base != expected:
        problems.append(f"{where}: {st} in the stub, a {expected} in the module")
    value = getattr(node, "value", None)
    if value is not None and ast.literal_eval(value) != runtime:
        problems.append(f"{where}: {ast.unparse(value)} in the stub, {runtime!r} in the module")
    return problems


def compare_class(name: str, member: StubMember, cls: type, stub: Stub) -> list[str]:
    problems = doc_problems(name, ast.get_docstring(member.nodes[0]), class_doc(cls))
    # Only a stub-only private base is allowed: _Enum, which holds the plumbing every enum
    # shares instead of repeating it in each.
    bases = [ast.unparse(b) for b in member.nodes[0].bases]
    if bases and not (_is_enum(cls) and bases == ["_Enum"]):
        problems.append(f"{name}: base classes in the stub, which pybind11 classes do not have")
    runtime = runtime_members(cls)
    required = {n for n in runtime if not (_is_enum(cls) and n in ENUM_PLUMBING)}
    for n in sorted(required - set(member.members)):
        problems.append(f"{name}.{n}: in the module, missing from the stub")
    for n, m in member.members.items():
        if n not in vars(cls):
            problems.append(f"{name}.{n}: in the stub, not in the module")
        else:
            problems += compare_member(f"{name}.{n}", m, vars(cls)[n], cls, stub)
    if _is_enum(cls):
        stub_values = [n for n, m in member.members.items()
                       if m.kind == "attribute" and canon(m.nodes[0].annotation, stub.aliases) == name]
        if stub_values != list(cls.__members__):
            problems.append(f"{name}: members {stub_values} in the stub, "
                            f"{list(cls.__members__)} in the module")
    return problems


def _annotations(tree: ast.AST) -> list[ast.expr]:
    """The annotations and defaults under ``tree``."""
    exprs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            exprs.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            exprs += [e for e in [node.returns] if e is not None]
            exprs += [d for d in node.args.defaults + node.args.kw_defaults if d is not None]
        if isinstance(node, ast.AnnAssign):
            exprs.append(node.annotation)
    return exprs


def _unresolved_names(stub: Stub) -> list[str]:
    """Names used in annotations and defaults that the stub does not define or import, or
    that a class's own member shadows there (Pending.bytes hides the builtin bytes in Pending)."""
    known = set(stub.members) | set(dir(builtins))
    problems = []
    for expr in _annotations(stub.tree):
        for name in ast.walk(expr):
            if isinstance(name, ast.Name) and name.id not in known:
                problems.append(f"stub: {name.id!r} is used but not defined or imported")
            if (isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name)
                    and name.value.id in stub.members
                    and stub.members[name.value.id].kind == "class"
                    and name.attr not in stub.members[name.value.id].members):
                problems.append(f"stub: {ast.unparse(name)} is not defined")
    for cls in stub.members.values():
        if cls.kind != "class":
            continue
        for expr in _annotations(cls.nodes[0]):
            if isinstance(expr, ast.Constant):
                continue  # a default
            for name in ast.walk(expr):
                if isinstance(name, ast.Name) and name.id in cls.members \
                        and cls.members[name.id].kind != "class":
                    problems.append(f"stub: in class {cls.name}, {name.id!r} names the member "
                                    f"{cls.name}.{name.id}, not the type (write builtins.{name.id})")
    return problems


def check(stub: Stub) -> list[str]:
    """Every difference between the stub and statepool._core, as text."""
    problems = doc_problems("module", ast.get_docstring(stub.tree), _core.__doc__)
    problems += _unresolved_names(stub)
    names = {n for n in vars(_core) if n not in MODULE_DUNDERS}
    for n in sorted(names - set(stub.members)):
        problems.append(f"{n}: in the module, missing from the stub")
    for n, m in stub.members.items():
        if m.kind in ("import", "alias") or (n.startswith("_") and n not in names):
            if m.kind == "alias" and not n.startswith("_") and n not in STUB_ONLY:
                problems.append(f"{n}: a public alias only the stub has (add it to STUB_ONLY)")
            continue
        if n not in names:
            problems.append(f"{n}: in the stub, not in the module")
        elif m.kind == "class":
            if not isinstance(getattr(_core, n), type):
                problems.append(f"{n}: a class in the stub, not in the module")
            else:
                problems += compare_class(n, m, getattr(_core, n), stub)
        else:
            problems += compare_member(n, m, getattr(_core, n), None, stub)
    for n in STUB_ONLY:
        if n not in stub.members or stub.members[n].kind != "alias":
            problems.append(f"{n}: STUB_ONLY names it, but the stub has no such alias")
        elif not _norm(stub.members[n].doc):
            problems.append(f"{n}: no docstring in the stub")
    return problems


# --- tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stub_text() -> str:
    return STUB_PATH.read_text()


@pytest.fixture(scope="module")
def stub(stub_text) -> Stub:
    return parse_stub(stub_text)


def test_the_stub_describes_the_module(stub):
    problems = check(stub)
    assert not problems, "python/statepool/_core.pyi and statepool._core differ:\n  " + \
        "\n  ".join(problems)


def test_every_binding_is_compared(stub):
    # Guards the guard: the comparison must see the module's classes and overloads at all.
    classes = [n for n, v in vars(_core).items() if isinstance(v, type)]
    assert len(classes) >= 20 and all(stub.members[n].kind == "class" for n in classes)
    assert len(runtime_overloads(_core.Connection.compress)) == 2
    sig = runtime_overloads(_core.connect)[0][0]
    assert [p.token for p in sig.params][:3] == ["socket_path", "*", "tenant"]
    assert sig.params[0].default == ("literal", str, _core.DEFAULT_SOCKET_PATH)


def test_the_stub_is_in_the_package():
    package = pathlib.Path(statepool.__file__).parent
    assert (package / "__init__.py").is_file()
    assert (package / "py.typed").is_file(), f"no py.typed (PEP 561) in {package}"
    assert (package / "_core.pyi").is_file(), f"no _core.pyi in {package}"
    assert pathlib.Path(_core.__file__).parent == package
    if STUB_PATH.is_file() and STUB_PATH.resolve() != (package / "_core.pyi").resolve():
        assert (package / "_core.pyi").read_text() == STUB_PATH.read_text(), \
            f"{package / '_core.pyi'} is not a copy of {STUB_PATH}: rebuild (cmake copies it)"


# Each mutation takes one thing away from the stub (or changes it); the checks must notice.
MUTATIONS = {
    "a missing method": (
        '    def ping(self) -> float:\n        """One round trip; returns its duration in seconds."""\n',
        "", "Connection.ping: in the module, missing from the stub"),
    "a missing property": (
        "    @property\n    def nbytes(self) -> int:\n        \"\"\"Bytes viewed.\"\"\"\n",
        "", "View.nbytes: in the module, missing from the stub"),
    "a missing enum member": (
        '    kda: ClassVar[Arch]\n    """Kimi Delta Attention: a gate per key channel."""\n',
        "", "Arch.kda: in the module, missing from the stub"),
    "a missing class": ('class PlanInfo:', 'class PlanInfo_:',
                        "PlanInfo: in the module, missing from the stub"),
    "a member the module lacks": (
        "    def drain(self) -> None:",
        "    def pong(self) -> None:\n        \"\"\"Nothing.\"\"\"\n    def drain(self) -> None:",
        "Connection.pong: in the stub, not in the module"),
    "a renamed parameter": ("    fd: int,\n    *,", "    descriptor: int,\n    *,",
                            "connect_fd: parameters"),
    "a lost keyword-only marker": ("        self,\n        *,\n        arch: Arch,\n",
                                   "        self,\n        arch: Arch,\n", "Plan.__init__: parameters"),
    "an extra keyword-only marker": ("def with_codec(self, codec", "def with_codec(self, *, codec",
                                     "StateLayout.with_codec: parameters"),
    "a changed default": ("    timeout: float = 10.0,\n    max_reply_bytes",
                          "    timeout: float = 5.0,\n    max_reply_bytes",
                          "connect: default of timeout"),
    "a lost default": ("def state_bytes(self, dtype: DType = DType.f32)",
                       "def state_bytes(self, dtype: DType)", "LayoutInfo.state_bytes: default"),
    "a lost overload": (
        '    @overload\n    def free(self, arena_id: int, slot_ids: Sequence[int]) -> int:\n'
        '        """Frees slot ids of one arena (released ones)."""\n', "",
        "Connection.free: a single @overload"),
    "a wrong return type": ("def ping(self) -> float:", "def ping(self) -> int:",
                            "Connection.ping: returns int in the stub, float in the module"),
    "a wrong parameter type": ("def open_staging(self, bytes: int)", "def open_staging(self, bytes: str)",
                               "Connection.open_staging: bytes is str"),
    "a writable property": (
        '    def valid(self) -> bool:\n        """False once freed or released."""\n',
        '    def valid(self) -> bool:\n        """False once freed or released."""\n'
        '    @valid.setter\n    def valid(self, value: bool) -> None: ...\n',
        "Slot.valid: read-only in the module"),
    "a drifted docstring": ("One round trip; returns", "Two round trips; return",
                            "Connection.ping: the stub's docstring"),
    "a missing docstring": ('        """Bytes viewed."""\n', "        ...\n",
                            "View.nbytes: no docstring"),
    "a shadowed builtin type": ("def event(self) -> builtins.bytes | None:",
                                "def event(self) -> bytes | None:",
                                "in class Pending, 'bytes' names the member"),
    "a typo in a type": ("def pages(self) -> View:", "def pages(self) -> Veiw:",
                         "'Veiw' is used but not defined"),
}


@pytest.mark.parametrize("what", sorted(MUTATIONS))
def test_the_checks_catch_drift(stub_text, what):
    old, new, expected = MUTATIONS[what]
    assert stub_text.count(old) == 1, f"the mutation {what!r} no longer applies to the stub: " \
                                      f"update MUTATIONS"
    problems = check(parse_stub(stub_text.replace(old, new)))
    assert any(expected in p for p in problems), \
        f"{what}: expected a problem containing {expected!r}, got {problems}"


def test_the_package_exports_every_error_class():
    import statepool
    import statepool.errors as errors
    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.StatepoolError)}
    assert classes == set(errors.__all__)
    assert classes <= set(statepool.__all__)
    assert all(getattr(statepool, name) is getattr(errors, name) for name in classes)
