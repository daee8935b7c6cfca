import pytest

import ordo


def test_the_hierarchy():
    for name in ["InvalidInput", "WrongDomain", "StorageError", "HandlerError"]:
        assert issubclass(getattr(ordo, name), ordo.Error), name
    assert issubclass(ordo.InvalidInput, ValueError)
    assert issubclass(ordo.Busy, ordo.StorageError)
    assert issubclass(ordo.CommitOutcomeUnknown, ordo.StorageError)
    assert issubclass(ordo.Error, Exception)
    for name in ["Retry", "Failed", "Unknown"]:
        cls = getattr(ordo, name)
        assert issubclass(cls, Exception)
        assert not issubclass(cls, ordo.Error), name
    assert ordo.InvalidInput.__module__ == "ordo"


def test_block_validates_its_code():
    block = ordo.Block("out_of_stock", "none left")
    assert (block.code, block.detail) == ("out_of_stock", "none left")
    assert ordo.Block("x").detail is None
    for bad in ["", "Upper", "with space", "x" * 65, "dash-ed"]:
        with pytest.raises(ordo.InvalidInput):
            ordo.Block(bad)
    with pytest.raises(TypeError):
        ordo.Block(7)


def test_another_domains_store_is_refused_and_unchanged(tmp_path, orders):
    path = str(tmp_path / "orders.db")
    before = orders.query("SELECT count(*) FROM outbox")
    with pytest.raises(ordo.WrongDomain):
        ordo.Producer.open(path, domain="billing")
    assert orders.query("SELECT count(*) FROM outbox") == before
    with pytest.raises(ordo.StorageError):
        ordo.Consumer.open(path, domain="orders")


def test_bad_names_are_invalid_input(tmp_path):
    with pytest.raises(ordo.InvalidInput):
        ordo.Producer.open(str(tmp_path / "a.db"), domain="Not A Domain")
    with pytest.raises(ordo.InvalidInput):
        ordo.Producer.open(str(tmp_path / "b.db"), domain="orders", name="bad name!")
    with pytest.raises(TypeError):
        ordo.Producer.open(42, domain="orders")
    with pytest.raises(TypeError):
        ordo.Producer.open(str(tmp_path / "c.db"), domain=7)
    with pytest.raises(TypeError):
        ordo.Producer.open(str(tmp_path / "d.db"), domain="orders", migrations="CREATE TABLE t (x)")
    with pytest.raises(ordo.InvalidInput):
        ordo.Producer.open(str(tmp_path / "e.db"), domain="orders",
                           migrations={"sqlite": ["CREATE TABLE t (x)"], "postgres": []})
