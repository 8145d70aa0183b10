"""The zoo's tables, the harness's references and the 2026 table are built from the family modules' rows."""

import importlib
import pkgutil

import d2lmini.reference as reference
from d2lmini.chapters import zoo
from d2lmini.reference import FAMILIES, HF_CONVERTERS, LAYER_ROWS, REFERENCES, ROWS_2026, TINY_CONFIGS


def test_every_module_with_rows_is_a_family():
    with_rows = {info.name for info in pkgutil.iter_modules(reference.__path__)
                 if hasattr(importlib.import_module(f"d2lmini.reference.{info.name}"), "ROWS")
                 or hasattr(importlib.import_module(f"d2lmini.reference.{info.name}"), "ROWS_2026")}
    assert with_rows == {family.__name__.rsplit(".", 1)[1] for family in FAMILIES}


def test_each_row_is_converted_by_its_own_family():
    for family in FAMILIES:
        for row in getattr(family, "ROWS", ()):
            assert HF_CONVERTERS[row.layer_class].__module__ == family.__name__, row.name
            assert row.tiny in TINY_CONFIGS, row.name


def test_the_tables_are_the_rows():
    assert sorted(row.name for row in zoo.ZOO) == sorted(row.name for row in LAYER_ROWS)
    assert [row.year for row in zoo.ZOO] == sorted(row.year for row in zoo.ZOO)
    assert sorted(row.model for row in zoo.ROWS_2026) == sorted(row.model for row in ROWS_2026)
    assert set(zoo.MODELING) == set(zoo.SIZES) == {row.model for row in ROWS_2026}
    assert {row.check for row in ROWS_2026} - {None} <= set(zoo.CHECKS)
    named = {row.layer_class: row for row in LAYER_ROWS if row.reference is not None}
    assert {name for name in REFERENCES if name in HF_CONVERTERS} == set(named)
    for name, row in named.items():
        assert REFERENCES[name].model == row.reference and REFERENCES[name].causal == row.causal


def test_each_2026_check_lives_in_its_family_module():
    # A new family is one file: its rows and the function that checks them, nothing in the zoo's module.
    for family in FAMILIES:
        for row in getattr(family, "ROWS_2026", ()):
            if row.check is None:
                assert row.verify is None and not row.zoo_rows, row.model
                continue
            assert (row.verify is None) == bool(row.zoo_rows), row.model  # one or the other
            if row.verify is not None:
                assert getattr(row.verify, "func", row.verify).__module__ == family.__name__, row.model
                assert zoo.CHECKS[row.check] is row.verify


def test_a_check_made_of_zoo_rows_names_rows_of_the_zoo():
    names = {row.name for row in zoo.ZOO}
    for row in ROWS_2026:
        assert set(row.zoo_rows) <= names, row.model
