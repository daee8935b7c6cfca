"""The reference domain from Python: the original experiment's flow.

A flow goes ``new -> reserved -> confirmed -> released`` carrying one fixed
quantity (1..1000000). Its stores are opened with ``domain="reservation"``
and no migrations (the tables come with ordo)::

    import ordo, ordo.reservation as reservation

    producer = ordo.Producer.open("producer.db", domain="reservation")
    consumer = ordo.Consumer.open("consumer.db", domain="reservation")
    reservation.advance(producer, "f-1", 0, "reserved", quantity=5)   # "committed"
    ordo.relay(producer, consumer)
    reservation.apply(consumer)                                        # projection and effect rows
    reservation.snapshot(producer, consumer)                           # as `ordo snapshot --json`

The rules are those of ``ordo advance`` and ``ordo apply`` (crate
``ordo-reservation``): schema 1 carries ``{"amount": q}``, schema 2
``{"units": q}``, which the consumer decodes only with ``support_v2=True``.
"""

from ordo._ordo import reservation as _native

DOMAIN = _native.DOMAIN
advance = _native.advance
apply = _native.apply
snapshot = _native.snapshot

__all__ = ["DOMAIN", "advance", "apply", "snapshot"]
