"""Field descriptions from the docstrings written right after the fields, read when they are needed.

Every configuration model documents a field with a docstring right after it (the single source
of the scenario file's JSON Schema and reference page). Pydantic can read them itself
(``use_attribute_docstrings``), but on Python 3.11 it then finds each class's source by parsing
its whole module once per class: about 50 ms at every import of ``harness.scenario``, paid by
every rank of every run. So the models leave that off, and :func:`document_models` reads the
docstrings once, with one parse per module, when documentation is made (``harness.scenario.
json_schema``, the tests). An explicit ``Field(description=...)`` is kept as it is.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from functools import cache

from pydantic import BaseModel


def document_models(root: type[BaseModel]) -> None:
    """Give every field of ``root``'s subclasses (and ``root``'s own) that has no description the
    docstring written after it, then rebuild their schemas so the descriptions show."""
    models = _subclasses(root)
    changed = [m for m in models if _describe(m)]
    for _ in range(2):  # a model's schema embeds its fields' models: rebuild once they all are
        for model in changed:
            model.model_rebuild(force=True)


def _subclasses(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {root: None}
    stack = [root]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen[sub] = None
                stack.append(sub)
    return list(seen)


def _describe(model: type[BaseModel]) -> bool:
    """Set the descriptions of ``model``'s fields from the docstrings of the class that declares
    each (itself, or the nearest base class); whether any was set."""
    changed = False
    for name, field in model.__pydantic_fields__.items():
        if field.description is not None:
            continue
        for cls in model.__mro__:
            if name in vars(cls).get("__annotations__", {}):
                doc = _docstrings(cls.__module__).get(cls.__qualname__, {}).get(name)
                if doc is not None:
                    field.description = doc
                    changed = True
                break
    return changed


@cache
def _docstrings(module_name: str) -> dict[str, dict[str, str]]:
    """{class qualname: {field: docstring}} of a module, from one parse of its source."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return {}
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    out: dict[str, dict[str, str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in getattr(node, "body", []):
            if isinstance(child, ast.ClassDef):
                qualname = f"{prefix}{child.name}"
                fields = out.setdefault(qualname, {})
                body = child.body
                for stmt, following in itertools.pairwise(body):
                    if (
                        isinstance(stmt, ast.AnnAssign)
                        and isinstance(stmt.target, ast.Name)
                        and isinstance(following, ast.Expr)
                        and isinstance(following.value, ast.Constant)
                        and isinstance(following.value.value, str)
                    ):
                        fields[stmt.target.id] = _clean(following.value.value)
                visit(child, f"{qualname}.")

    visit(tree, "")
    return out


def _clean(text: str) -> str:
    """A docstring as pydantic's ``use_attribute_docstrings`` gives it: dedented, stripped."""
    return inspect.cleandoc(text)
