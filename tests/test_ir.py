"""``ir.quick_init``: the fast ``__init__`` every IR node type gets makes the same object."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tcdsl import commands, ir

NODE_TYPES = sorted(
    (
        t
        for t in [*vars(ir).values(), commands.Command]
        if isinstance(t, type)
        and t.__module__ in (ir.__name__, commands.__name__)
        and dataclasses.is_dataclass(t)
    ),
    key=lambda t: t.__qualname__,
)


class _Mark:
    """A distinct value per field, so a field set from the wrong argument shows."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _made_quick(t: type) -> bool:
    return t.__init__.__code__.co_filename == "<string>" and "_set_" in " ".join(
        t.__init__.__code__.co_names
    )


def test_every_node_type_of_the_ir_is_made_quick() -> None:
    quick = [t for t in NODE_TYPES if _made_quick(t)]
    # The ones left alone are those quick_init cannot copy exactly; there are few.
    assert len(quick) >= len(NODE_TYPES) - 3, [t for t in NODE_TYPES if t not in quick]
    assert commands.Command in quick and ir.Class in quick and ir.Interface in quick


@pytest.mark.parametrize("node", NODE_TYPES, ids=lambda t: t.__qualname__)
def test_quick_init_sets_each_field_from_its_own_argument(node: type) -> None:
    fields = dataclasses.fields(node)
    values = {f.name: _Mark(f.name) for f in fields if f.init}
    made = node(**values)
    for f in fields:
        if f.init:
            assert getattr(made, f.name) is values[f.name], f.name
    positional = node(*values.values()) if all(not f.kw_only for f in fields) else made
    assert positional == made
    # Still frozen, still slotted.
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0].name, None)
    assert not hasattr(made, "__dict__")


@pytest.mark.parametrize("node", NODE_TYPES, ids=lambda t: t.__qualname__)
def test_quick_init_keeps_defaults_and_the_signature(node: type) -> None:
    fields = [f for f in dataclasses.fields(node) if f.init]
    required = {f.name: _Mark(f.name) for f in fields if f.default is dataclasses.MISSING}
    if any(f.default_factory is not dataclasses.MISSING for f in fields):
        pytest.skip("a default factory: quick_init leaves the class alone")
    made = node(**required)
    for f in fields:
        expected = required.get(f.name, f.default)
        assert getattr(made, f.name) is expected, f.name
    assert list(inspect.signature(node).parameters) == [f.name for f in fields]
    with pytest.raises(TypeError):
        node(**required, no_such_field=1)


def test_a_class_it_cannot_copy_is_left_as_it_is() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    generated = Checked.__init__
    assert ir.quick_init(Checked) is Checked and Checked.__init__ is generated
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Plain:
        a: int
        b: str = "x"

    ir.quick_init(Plain)
    assert _made_quick(Plain)
    assert Plain(1) == Plain(1, "x") and Plain(1).b == "x" and Plain(2, b="y").b == "y"
