"""The hot paths' frozen-dataclass construction (plugin_framework/_frozen.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from plugin_framework._frozen import frozen_setters, new_object


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int


def test_setters_build_an_object_equal_to_the_constructors() -> None:
    set_x, set_y = frozen_setters(Point, "x", "y")
    p = new_object(Point)
    set_x(p, 1)
    set_y(p, 2)
    assert p == Point(1, 2)
    assert hash(p) == hash(Point(1, 2))


@pytest.mark.parametrize("names", [("x",), ("y", "x"), ("x", "y", "z")])
def test_every_field_in_order_is_required(names: tuple[str, ...]) -> None:
    with pytest.raises(TypeError, match="fields"):
        frozen_setters(Point, *names)


def test_a_class_with_post_init_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="__post_init__"):
        frozen_setters(Checked, "x")
