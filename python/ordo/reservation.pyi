"""Type stubs of ordo.reservation, the built-in reference domain."""

from typing import Any, Dict, Optional

from ordo import Consumer, Producer, Report

DOMAIN: str

def advance(
    producer: Producer,
    flow_id: str,
    expected_seq: int,
    to: str,
    quantity: Optional[int] = None,
    schema_version: int = 1,
) -> str: ...
def apply(consumer: Consumer, support_v2: bool = False) -> Report: ...
def snapshot(producer: Optional[Producer] = None, consumer: Optional[Consumer] = None) -> Dict[str, Any]: ...
